//! Certificates for TLS tests, made by rcgen: a CA, a server certificate
//! for 127.0.0.1 and localhost, a client certificate, all signed by it,
//! and a second CA that signed nothing (the wrong CA), as PEM files.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::path::{Path, PathBuf};

/// PEM files in one directory.
pub struct TestPki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed none of these.
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("a key");
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let pem = p.self_signed(&key).expect("a CA").pem();
    (p, key, pem)
}

/// Make the files in `dir`.
pub fn make(dir: &Path) -> TestPki {
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write a PEM file");
        p
    };
    let (ca_params, ca_key, ca_pem) = ca("vmscope test CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("a key");
    let mut sp = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("server params");
    sp.distinguished_name
        .push(DnType::CommonName, "vmscope test server");
    let server = sp
        .signed_by(&server_key, &issuer)
        .expect("a server certificate");
    let client_key = KeyPair::generate().expect("a key");
    let mut cp = CertificateParams::new(Vec::<String>::new()).expect("client params");
    cp.distinguished_name
        .push(DnType::CommonName, "vmscope test scraper");
    let client = cp
        .signed_by(&client_key, &issuer)
        .expect("a client certificate");
    let (_, _, other_pem) = ca("some other CA");
    TestPki {
        ca: write("ca.pem", &ca_pem),
        server_cert: write("server.pem", &server.pem()),
        server_key: write("server.key", &server_key.serialize_pem()),
        client_cert: write("client.pem", &client.pem()),
        client_key: write("client.key", &client_key.serialize_pem()),
        other_ca: write("other-ca.pem", &other_pem),
    }
}
