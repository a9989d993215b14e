"""An independent client drives the lab: proxmoxer (PyPI) with the lab's API token.

Run by lab/tests/lab/proxmoxer.rs with the venv scripts/lab-deps makes; reads the lab's exports
(PVE_URL, PVE_TOKEN, ...) and LAB_TEST_VMID from the environment.
"""

import os
import sys
import unittest
from urllib.parse import urlparse

from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException
from proxmoxer.tools import Tasks

VMID = int(os.environ["LAB_TEST_VMID"])
NODE = os.environ["PVE_NODE"]


def connect(token=None):
    url = urlparse(os.environ["PVE_URL"])
    user, rest = (token or os.environ["PVE_TOKEN"]).split("!", 1)
    name, value = rest.split("=", 1)
    # The lab's certificate is self-signed and pinned by fingerprint elsewhere; requests
    # cannot pin, so verification is off here.
    return ProxmoxAPI(url.hostname, port=url.port, user=user, token_name=name, token_value=value, verify_ssl=False)


class ProxmoxerDrivesTheLab(unittest.TestCase):
    def setUp(self):
        self.px = connect()
        self.node = self.px.nodes(NODE)

    def wait(self, upid):
        status = Tasks.blocking_status(self.px, upid, timeout=120, polling_interval=0.1)
        return status["exitstatus"]

    def test_lifecycle_and_errors(self):
        nodes = [n["node"] for n in self.px.nodes.get()]
        self.assertIn(NODE, nodes)
        self.assertGreaterEqual(int(self.px.cluster.nextid.get()), 100)
        key = open(os.environ["PVE_NODE_SSH_KEY"] + ".pub").read()
        upid = self.node.lxc.post(
            vmid=VMID,
            ostemplate=os.environ["LAB_TEMPLATE"],
            hostname="proxmoxer",
            memory=256,
            net0="name=eth0,bridge=%s,ip=%s/24" % (os.environ["LAB_BRIDGE"], os.environ["LAB_TEST_IP"]),
            rootfs="local:2",
            **{"ssh-public-keys": key},
        )
        self.assertTrue(upid.startswith("UPID:%s:" % NODE), upid)
        try:
            with self.assertRaises(ResourceException) as dup:
                self.node.lxc.post(vmid=VMID, ostemplate=os.environ["LAB_TEMPLATE"])
            self.assertEqual(dup.exception.status_code, 500)
            self.assertIn("CT %d already exists on node '%s'" % (VMID, NODE), str(dup.exception))
            self.assertEqual(self.wait(upid), "OK")
            ct = self.node.lxc(VMID)
            conf = ct.config.get()
            self.assertEqual(conf["hostname"], "proxmoxer")
            self.assertEqual(conf["unprivileged"], 1)
            self.assertIn("hwaddr=BC:24:11:", conf["net0"])
            ct.config.put(memory=384, digest=conf["digest"])
            self.assertEqual(ct.config.get()["memory"], 384)
            with self.assertRaises(ResourceException) as stale:
                ct.config.put(memory=512, digest=conf["digest"])
            self.assertIn("detected modified configuration", str(stale.exception))
            with self.assertRaises(ResourceException) as bad:
                ct.config.put(memory="lots")
            self.assertEqual(bad.exception.status_code, 400)
            self.assertIn("memory", bad.exception.errors)
            self.assertEqual(self.wait(ct.status.start.post()), "OK")
            self.assertEqual(ct.status.current.get()["status"], "running")
            with self.assertRaises(ResourceException) as running:
                ct.status.start.post()
            self.assertIn("CT %d already running" % VMID, str(running.exception))
            self.assertEqual(self.wait(ct.status.stop.post()), "OK")
            with self.assertRaises(ResourceException) as stopped:
                ct.status.stop.post()
            self.assertIn("CT %d not running" % VMID, str(stopped.exception))
        finally:
            try:
                self.node.lxc(VMID).status.stop.post()
            except ResourceException:
                pass
            self.wait(self.node.lxc(VMID).delete())
        with self.assertRaises(ResourceException) as gone:
            self.node.lxc(VMID).config.get()
        self.assertIn("does not exist", str(gone.exception))

    def test_token_limits(self):
        with self.assertRaises(ResourceException) as forbidden:
            self.node.lxc.post(
                vmid=VMID + 1,
                ostemplate=os.environ["LAB_TEMPLATE"],
                mp0="%s,mp=/shared" % os.environ["LAB_SHARED_DIR"],
            )
        self.assertEqual(forbidden.exception.status_code, 403)
        self.assertIn("mount point type bind is only allowed for root@pam", str(forbidden.exception))
        with self.assertRaises(ResourceException) as unauth:
            connect("root@pam!lab=wrong").nodes.get()
        self.assertEqual(unauth.exception.status_code, 401)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
