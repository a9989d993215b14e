//! The API server: HTTPS on 127.0.0.1:8006 with a certificate made at start, and the
//! static mirror on the bridge address.

pub mod auth;
mod cluster;
pub mod faults;
mod http;
mod lxc;
mod mirror;
mod router;
pub mod schema;
mod schema_format;
mod storage;
pub mod tasks;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::node::Node;
use crate::paths::Settings;

/// Everything a request handler can reach. In cluster mode the router hands a handler the
/// view of the node its path names (`/nodes/{node}/...`); the rest is shared.
#[derive(Clone)]
pub struct App {
    /// Container operations of the node the request addresses (the API's own node when
    /// the path names none).
    pub node: Node,
    /// That node's running and finished tasks.
    pub tasks: Arc<tasks::Tasks>,
    /// Every node of the cluster, the API's own first (just it outside cluster mode).
    pub members: Arc<Vec<Member>>,
    /// Passwords, token secrets, ticket key.
    pub secrets: Arc<auth::Secrets>,
    /// Injected failures.
    pub faults: Arc<faults::Faults>,
    /// The official schema, when available; `Err` says why the layer is skipped.
    pub schema: Arc<Result<schema::Schema, String>>,
}

/// One node of the (lab) cluster: its containers and its tasks.
pub struct Member {
    /// Its container operations.
    pub node: Node,
    /// Its tasks.
    pub tasks: Arc<tasks::Tasks>,
}

impl App {
    /// The view of node `name`, or `None` when the cluster has no such node.
    pub fn on(&self, name: &str) -> Option<App> {
        let m = self.members.iter().find(|m| m.node.lab.node == name)?;
        Some(App {
            node: m.node.clone(),
            tasks: m.tasks.clone(),
            ..self.clone()
        })
    }
}

/// The self-signed certificate made at start.
pub struct Certificate {
    /// PEM of the certificate.
    pub cert_pem: String,
    /// PEM of its key.
    pub key_pem: String,
    /// DER of the certificate.
    pub cert_der: Vec<u8>,
    /// DER (PKCS#8) of its key.
    pub key_der: Vec<u8>,
    /// SHA-256 fingerprint, `AB:CD:...`.
    pub fingerprint: String,
}

/// Makes the self-signed certificate for the node.
pub fn make_certificate(node: &str) -> Result<Certificate> {
    let names = vec![
        node.to_string(),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ];
    let cert = rcgen::generate_simple_self_signed(names).context("making the certificate")?;
    let cert_der = cert.cert.der().to_vec();
    let fingerprint = crate::client::fingerprint(&cert_der);
    Ok(Certificate {
        cert_pem: cert.cert.pem(),
        key_pem: cert.signing_key.serialize_pem(),
        key_der: cert.signing_key.serialize_der(),
        cert_der,
        fingerprint,
    })
}

/// The node's certificate: made at the first start (and again after `reinstall`), then kept,
/// so `PVE_FINGERPRINT` stays valid across `down`/`up`.
fn load_or_make_certificate(lab: &Settings) -> Result<Certificate> {
    let dir = lab.secrets_dir();
    let (cert_der, key_der) = (dir.join("pve-ssl.der"), dir.join("pve-ssl.key.der"));
    if let (Ok(c), Ok(k)) = (std::fs::read(&cert_der), std::fs::read(&key_der)) {
        let fingerprint = crate::client::fingerprint(&c);
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        return Ok(Certificate {
            cert_pem: read("pve-ssl.pem"),
            key_pem: read("pve-ssl.key"),
            cert_der: c,
            key_der: k,
            fingerprint,
        });
    }
    let cert = make_certificate(&lab.node)?;
    std::fs::write(dir.join("pve-ssl.pem"), &cert.cert_pem)?;
    std::fs::write(dir.join("pve-ssl.key"), &cert.key_pem)?;
    std::fs::write(&key_der, &cert.key_der)?;
    std::fs::write(&cert_der, &cert.cert_der)?;
    std::fs::write(dir.join("fingerprint"), format!("{}\n", cert.fingerprint))?;
    Ok(cert)
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn serve(lab: Settings) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let secrets = auth::Secrets::load(&lab)?;
    let cert = load_or_make_certificate(&lab)?;
    let schema = match &lab.schema {
        Some(p) => schema::Schema::load(p).map_err(|e| format!("{e:#}")),
        None => Err("../shared/pve-api not found".to_string()),
    };
    match &schema {
        Ok(_) => eprintln!(
            "pve-lab: schema validation on ({})",
            lab.schema.as_ref().expect("set").display()
        ),
        Err(why) => eprintln!("pve-lab: schema validation skipped: {why}"),
    }
    let faults = faults::Faults::from_env()?;
    let members: Vec<Member> = lab
        .members()
        .into_iter()
        .map(|s| Member {
            tasks: Arc::new(tasks::Tasks::new(&s.node)),
            node: Node::new(s),
        })
        .collect();
    if members.len() > 1 {
        let names: Vec<&str> = members.iter().map(|m| m.node.lab.node.as_str()).collect();
        eprintln!("pve-lab: cluster mode, nodes {}", names.join(", "));
    }
    let app = Arc::new(App {
        tasks: members[0].tasks.clone(),
        node: members[0].node.clone(),
        members: Arc::new(members),
        secrets: Arc::new(secrets),
        faults: Arc::new(faults),
        schema: Arc::new(schema),
    });

    let certs = vec![rustls::pki_types::CertificateDer::from(
        cert.cert_der.clone(),
    )];
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_der.clone().into());
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let addr = SocketAddr::from(([127, 0, 0, 1], lab.api_port));
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let mirror_addr = SocketAddr::from((lab.bridge_ip(), lab.mirror_port));
    let mirror = TcpListener::bind(mirror_addr)
        .await
        .with_context(|| format!("binding {mirror_addr}"))?;
    tokio::spawn(mirror::serve(mirror, lab.mirror_dir.clone()));
    eprintln!("pve-lab: listening on https://{addr}/api2/json, mirror on http://{mirror_addr}/");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => r?,
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = service_fn(move |req| router::handle(app.clone(), req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
    eprintln!("pve-lab: stopping");
    Ok(())
}
