"""Downloads a repo with the real huggingface_hub client (used by tests/hub/python.rs).

usage: snapshot.py ENDPOINT REPO LOCAL_DIR
A token, when needed, comes from HF_TOKEN in the environment, as huggingface_hub reads it.
"""

import sys

import huggingface_hub


def main() -> int:
    endpoint, repo, local_dir = sys.argv[1:4]
    path = huggingface_hub.snapshot_download(repo_id=repo, endpoint=endpoint, local_dir=local_dir)
    print(path)
    print("huggingface_hub", huggingface_hub.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
