//! Certificates made for the test: a certificate authority, a server
//! certificate it signed for `localhost`, one that has expired, and an
//! authority nobody asked to trust (the operator tests' TLS, and the TLS
//! flood of the walls' figures).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A certificate and its key, as PEM files.
pub struct Pair {
    /// The certificate chain (the leaf alone: the authority is the root).
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// The files of one test's public-key infrastructure.
pub struct Pki {
    _dir: tempfile::TempDir,
    /// The authority's certificate: what `--ca` trusts.
    pub ca: PathBuf,
    /// Another authority's certificate: trusting it is trusting the wrong one.
    pub other_ca: PathBuf,
    /// A certificate for `localhost` (and no IP address) signed by `ca`.
    pub localhost: Pair,
    /// A certificate for `localhost` signed by `ca` that expired in 2021.
    pub expired: Pair,
}

fn authority(name: &str) -> (CertificateParams, KeyPair) {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (params, key)
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("a PEM file");
    path
}

impl Pki {
    /// Makes every certificate, in a scratch directory of its own.
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("scratch");
        let (ca_params, ca_key) = authority("runloop test authority");
        let ca_cert = ca_params.self_signed(&ca_key).expect("the authority");
        let issuer = Issuer::new(ca_params, ca_key);
        let (other_params, other_key) = authority("another authority");
        let other_cert = other_params.self_signed(&other_key).expect("the other");

        let leaf = |name: &str, expired: bool| {
            let key = KeyPair::generate().expect("a key");
            let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
            params
                .distinguished_name
                .push(DnType::CommonName, "localhost");
            if expired {
                params.not_before = rcgen::date_time_ymd(2020, 1, 1);
                params.not_after = rcgen::date_time_ymd(2021, 1, 1);
            }
            let cert = params.signed_by(&key, &issuer).expect("a leaf");
            Pair {
                cert: write(dir.path(), &format!("{name}.pem"), &cert.pem()),
                key: write(dir.path(), &format!("{name}.key"), &key.serialize_pem()),
            }
        };
        let localhost = leaf("localhost", false);
        let expired = leaf("expired", true);
        Pki {
            ca: write(dir.path(), "ca.pem", &ca_cert.pem()),
            other_ca: write(dir.path(), "other-ca.pem", &other_cert.pem()),
            localhost,
            expired,
            _dir: dir,
        }
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}
