//! TLS settings for `wss://` (protocol §1 allows it; the framed protocol
//! never sees it): the server's certificate, which can be reloaded while
//! connections stay up, and the client's trust roots.
//!
//! The server reads a PEM certificate chain and a PEM private key (PKCS#8,
//! PKCS#1 RSA or SEC1 EC) and checks that they belong together before it
//! serves anything. Its certificate sits behind a resolver that every new
//! handshake asks, so [`ServerTls::reload`] (`runloop serve` calls it on
//! SIGHUP) swaps in renewed files for the next connection without touching
//! the ones already open; files that do not load leave the old certificate
//! in place.
//!
//! The client trusts the platform's roots (the operator's machine decides,
//! local authorities included) plus any certificate authority it is given.
//! There is no switch that turns verification off: a certificate that does
//! not verify ends the connection with an error that names the host and
//! the reason ([`crate::transport::DialError`]).
//!
//! Both sides use the `ring` provider, named explicitly, so the process
//! never depends on which provider some other crate made the default.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::small_file::{self, SmallFileError};

/// The largest PEM file read (a certificate chain, a key, a CA bundle):
/// a chain is a few KiB, a bundle of every public authority a few hundred.
pub const MAX_PEM_FILE: u64 = 1 << 20;

/// Both sides offer HTTP/1.1 by ALPN, which a WebSocket upgrade rides on;
/// a load balancer that terminates TLS may insist on an ALPN match.
const ALPN: &[u8] = b"http/1.1";

/// Why TLS settings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read: the system's error, or it is not a
    /// regular file, or it is larger than [`MAX_PEM_FILE`]
    /// ([`small_file`]).
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: SmallFileError,
    },
    /// A file's PEM does not parse.
    #[error("{} is not valid PEM", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: pem::Error,
    },
    /// A certificate file holds no certificate.
    #[error("{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A key file holds no private key.
    #[error("{} holds no PEM private key (PKCS#8, RSA or EC)", path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// The key cannot be used, or does not go with the certificate.
    #[error("the key in {} cannot serve the certificate in {}", key.display(), cert.display())]
    Key {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What is wrong.
        #[source]
        source: rustls::Error,
    },
    /// A certificate authority's certificate cannot be trusted as a root.
    #[error("{} cannot be used as a certificate authority", path.display())]
    Authority {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: rustls::Error,
    },
    /// Nothing to trust: the platform offered no root, and no authority was
    /// given.
    #[error("no certificate authority to trust: the platform's store offered none{}", platform_errors(.0))]
    NoRoots(Vec<String>),
    /// The provider refused the protocol versions (not expected with `ring`).
    #[error("the TLS provider refused the protocol versions")]
    Settings(#[source] rustls::Error),
}

fn platform_errors(errors: &[String]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        format!(" ({})", errors.join("; "))
    }
}

/// The crypto provider of both sides.
fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}

/// Makes `ring` the process's default rustls provider, unless one is set
/// already. The sides of this crate name theirs; this is for clients that
/// take the process's default: reqwest, built with TLS but no provider of
/// its own (the registry client's `rustls-no-provider`, a feature every
/// reqwest of the build then has), panics when it makes a client with
/// neither. Call it before making one.
pub fn install_default_provider() {
    if CryptoProvider::get_default().is_none() {
        // Another thread may have set one meanwhile: theirs stands.
        let _ = CryptoProvider::install_default(rustls::crypto::ring::default_provider());
    }
}

/// Reads a PEM file: a regular file of at most [`MAX_PEM_FILE`] bytes,
/// never waiting on a FIFO nor reading a device on and on.
fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    small_file::read_bytes(path, MAX_PEM_FILE).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file, in order; at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|source| match source {
        pem::Error::NoItemsFound => TlsError::NoKey {
            path: path.to_owned(),
        },
        source => TlsError::Pem {
            path: path.to_owned(),
            source,
        },
    })
}

/// The server's certificate and key, swapped whole by a reload.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A reload that panicked mid-swap cannot leave a half-written Arc.
        let current = self
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(Arc::clone(&current))
    }
}

/// The server's TLS: a certificate chain and its key, from PEM files.
#[derive(Clone)]
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<Current>,
    config: Arc<ServerConfig>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the certificate chain in `cert` (leaf first) and the private
    /// key in `key`, and checks that the key is the certificate's.
    pub fn load(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Result<ServerTls, TlsError> {
        let (cert, key) = (cert.into(), key.into());
        let current = Arc::new(Current(RwLock::new(Arc::new(certified_key(&cert, &key)?))));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Settings)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&current) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(ServerTls {
            cert,
            key,
            current,
            config: Arc::new(config),
        })
    }

    /// Reads the files again and serves what they hold from the next
    /// handshake on; connections already open keep theirs. When the files
    /// do not load, the certificate served stays as it was.
    pub fn reload(&self) -> Result<(), TlsError> {
        let renewed = Arc::new(certified_key(&self.cert, &self.key)?);
        let mut current = self
            .current
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *current = renewed;
        Ok(())
    }

    /// The certificate file.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// An acceptor for incoming connections.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.config))
    }
}

fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert)?;
    let der = private_key(key)?;
    CertifiedKey::from_der(chain, der, &provider()).map_err(|source| TlsError::Key {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    })
}

/// The client's TLS: which certificate authorities it trusts.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the platform's roots and, besides them, every certificate in
    /// each of `authorities` (PEM files).
    ///
    /// The platform's store is read on each call (a few hundred files on
    /// Linux): make one and share it. A platform store that is missing or
    /// partly unreadable is not an error as long as something is trusted.
    pub fn new(authorities: &[PathBuf]) -> Result<ClientTls, TlsError> {
        let mut roots = RootCertStore::empty();
        let platform = rustls_native_certs::load_native_certs();
        // Certificates of the store that rustls cannot use are skipped, as
        // every TLS client skips them.
        let _ = roots.add_parsable_certificates(platform.certs);
        for path in authorities {
            for cert in certificates(path)? {
                roots.add(cert).map_err(|source| TlsError::Authority {
                    path: path.clone(),
                    source,
                })?;
            }
        }
        if roots.is_empty() {
            return Err(TlsError::NoRoots(
                platform.errors.iter().map(ToString::to_string).collect(),
            ));
        }
        ClientTls::trusting(roots)
    }

    fn trusting(roots: RootCertStore) -> Result<ClientTls, TlsError> {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Settings)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(ClientTls {
            config: Arc::new(config),
        })
    }

    /// The platform's roots as [`ClientTls::platform`] reads them, or,
    /// when there are none, TLS that trusts nothing (every handshake fails
    /// with an unknown issuer) and why: for a client whose plain-HTTP uses
    /// must go on without them (the registry client's insecure registries).
    pub fn platform_or_none() -> Result<(ClientTls, Option<TlsError>), TlsError> {
        match ClientTls::platform() {
            Ok(tls) => Ok((tls, None)),
            Err(why) => Ok((ClientTls::trusting(RootCertStore::empty())?, Some(why))),
        }
    }

    /// The platform's roots alone, read once per process.
    pub fn platform() -> Result<ClientTls, TlsError> {
        static PLATFORM: OnceLock<ClientTls> = OnceLock::new();
        if let Some(tls) = PLATFORM.get() {
            return Ok(tls.clone());
        }
        let tls = ClientTls::new(&[])?;
        Ok(PLATFORM.get_or_init(|| tls).clone())
    }

    /// A connector for outgoing connections.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(Arc::clone(&self.config))
    }

    /// Its rustls settings (these roots, the `ring` provider), for another
    /// client of the process to use the same TLS: the registry client's
    /// HTTP/1.1 (`http/1.1` is offered by ALPN, as for a WebSocket dial).
    pub fn rustls_config(&self) -> ClientConfig {
        ClientConfig::clone(&self.config)
    }
}

#[cfg(test)]
mod tests {
    use runloop_proto::error_chain::Chain;
    use runloop_testkit::errors::assert_cause_said_once;

    use super::*;

    /// A FIFO at `path`, with no writer.
    fn fifo(path: &Path) {
        let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: a system call on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("scratch file");
        path
    }

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        (cert.pem(), key.serialize_pem())
    }

    /// A scratch directory where a certificate for `localhost` and its key
    /// are written as `cert.pem` and `key.pem`.
    struct Files {
        scratch: tempfile::TempDir,
        cert: PathBuf,
        key: PathBuf,
        /// The certificate's PEM text, and the key's.
        cert_pem: String,
        key_pem: String,
    }

    impl Files {
        fn new() -> Files {
            let scratch = tempfile::tempdir().expect("scratch dir");
            let (cert_pem, key_pem) = pair("localhost");
            Files {
                cert: write(scratch.path(), "cert.pem", &cert_pem),
                key: write(scratch.path(), "key.pem", &key_pem),
                cert_pem,
                key_pem,
                scratch,
            }
        }

        fn dir(&self) -> &Path {
            self.scratch.path()
        }
    }

    /// The certificate `tls` serves now.
    fn served(tls: &ServerTls) -> Vec<u8> {
        tls.current.0.read().expect("lock").cert[0]
            .as_ref()
            .to_vec()
    }

    #[test]
    fn a_certificate_and_its_key_load_and_reload() {
        let files = Files::new();
        let (dir, cert_path, key_path) = (files.dir(), files.cert.clone(), files.key.clone());
        let tls = ServerTls::load(&cert_path, &key_path).expect("loads");
        let before = served(&tls);
        // Renewed files are served after a reload…
        let (cert2, key2) = pair("localhost");
        write(dir, "cert.pem", &cert2);
        write(dir, "key.pem", &key2);
        tls.reload().expect("reloads");
        assert_ne!(served(&tls), before);
        // …and files that do not load leave the certificate as it was.
        let after = served(&tls);
        write(dir, "key.pem", &files.key_pem);
        let error = tls.reload().expect_err("a key of another certificate");
        assert!(matches!(error, TlsError::Key { .. }), "{error}");
        assert!(error.to_string().contains("key.pem"), "{error}");
        assert_cause_said_once(&error);
        assert_eq!(served(&tls), after);
    }

    #[test]
    fn files_that_are_not_a_certificate_or_a_key_are_named() {
        let files = Files::new();
        let (dir, cert_path, key_path) = (files.dir(), files.cert.clone(), files.key.clone());
        let empty = write(dir, "empty.pem", "");
        let missing = dir.join("missing.pem");

        let cases: [(&Path, &Path, &str); 5] = [
            (&key_path, &key_path, "holds no PEM certificate"),
            (&cert_path, &cert_path, "holds no PEM private key"),
            (&empty, &key_path, "empty.pem holds no PEM certificate"),
            (&missing, &key_path, "cannot read"),
            (&cert_path, &missing, "missing.pem"),
        ];
        for (cert, key, expected) in cases {
            let error = ServerTls::load(cert, key).expect_err(expected);
            assert!(error.to_string().contains(expected), "{error}");
            assert_cause_said_once(&error);
        }
        let garbled = write(dir, "garbled.pem", "-----BEGIN CERTIFICATE-----\n!!!\n");
        let error = ServerTls::load(&garbled, &key_path).expect_err("garbled");
        assert!(matches!(error, TlsError::Pem { .. }), "{error}");
        assert!(std::error::Error::source(&error).is_some());
        assert_cause_said_once(&error);
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_at_once_on_load_and_on_reload() {
        let files = Files::new();
        let (dir, cert_path, key_path) = (files.dir(), files.cert.clone(), files.key.clone());
        let pipe = dir.join("pipe.pem");
        fifo(&pipe);
        let zero = Path::new("/dev/zero");
        let refused = |error: TlsError, path: &Path, fault: &str| {
            assert!(matches!(error, TlsError::Read { .. }), "{error}");
            assert_cause_said_once(&error);
            assert_eq!(
                Chain(&error).to_string(),
                format!(
                    "cannot read {}: it is {fault}, not a regular file",
                    path.display()
                )
            );
        };
        let fifo_fault = "a FIFO (named pipe)";
        let device_fault = "a character device";

        // On load: a FIFO with no writer is refused without waiting for
        // one, and a device that never ends is not read.
        let error = ServerTls::load(&pipe, &key_path).expect_err("a FIFO certificate");
        refused(error, &pipe, fifo_fault);
        let error = ServerTls::load(&cert_path, zero).expect_err("a device key");
        refused(error, zero, device_fault);

        // On reload: the same, and the certificate served stays in force.
        let tls = ServerTls::load(&cert_path, &key_path).expect("loads");
        let before = served(&tls);
        std::fs::remove_file(&cert_path).expect("removed");
        fifo(&cert_path);
        refused(tls.reload().expect_err("a FIFO"), &cert_path, fifo_fault);
        assert_eq!(served(&tls), before);
        std::fs::remove_file(&cert_path).expect("removed");
        write(dir, "cert.pem", &files.cert_pem);
        std::fs::remove_file(&key_path).expect("removed");
        std::os::unix::fs::symlink(zero, &key_path).expect("a link");
        refused(tls.reload().expect_err("a device"), &key_path, device_fault);
        assert_eq!(served(&tls), before);

        // An authority the client trusts is read the same way.
        let error = ClientTls::new(std::slice::from_ref(&pipe)).expect_err("a FIFO authority");
        refused(error, &pipe, fifo_fault);
        let error = ClientTls::new(&[zero.to_owned()]).expect_err("a device authority");
        refused(error, zero, device_fault);
    }

    #[test]
    fn a_file_past_the_pem_bound_is_refused_unread() {
        let files = Files::new();
        let key_path = files.key.clone();
        // Sparse: a gigabyte that takes no disk.
        let large = files.dir().join("large.pem");
        std::fs::File::create(&large)
            .expect("created")
            .set_len(1 << 30)
            .expect("grown");
        let error = ServerTls::load(&large, &key_path).expect_err("too large");
        assert!(
            matches!(
                &error,
                TlsError::Read {
                    source: SmallFileError::TooLarge(MAX_PEM_FILE),
                    ..
                }
            ),
            "{error}"
        );
        assert_cause_said_once(&error);
    }

    #[test]
    fn an_authority_file_is_added_to_the_roots() {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let dir = scratch.path();
        let (cert, key) = pair("ca.test");
        let ca = write(dir, "ca.pem", &cert);
        assert!(ClientTls::new(&[ca]).is_ok());
        let not_a_cert = write(dir, "key.pem", &key);
        let error = ClientTls::new(&[not_a_cert]).expect_err("a key is no authority");
        assert!(
            error.to_string().contains("holds no PEM certificate"),
            "{error}"
        );
    }
}
