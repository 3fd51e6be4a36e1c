//! The error convention over this crate's errors: each says its own
//! layer's sentence and leaves its cause to `source()`, so the command's
//! chain printer says every link once.

use std::error::Error;
use std::io;

use runloop_oci::HostError;
use runloop_oci::bundle::BundleError;
use runloop_oci::digest::{Digest, DigestError};
use runloop_oci::disk::DiskError;
use runloop_oci::distribution::FetchError;
use runloop_oci::egress::EgressError;
use runloop_oci::gc::GcError;
use runloop_oci::layout::LayoutError;
use runloop_oci::network::NetworkError;
use runloop_oci::store::StoreError;
use runloop_oci::unpack::UnpackError;
use runloop_proto::error_chain::Chain;
use runloop_testkit::errors::assert_cause_said_once;
use runloop_wire::tls::TlsError;

fn system() -> io::Error {
    io::Error::from(io::ErrorKind::PermissionDenied)
}

fn digest() -> Digest {
    format!("sha256:{}", "0".repeat(64))
        .parse()
        .expect("a digest")
}

fn layer() -> StoreError {
    StoreError::Layer {
        index: 2,
        digest: digest().to_string(),
        source: UnpackError::Entry {
            entry: "etc/passwd".into(),
            source: system(),
        },
    }
}

#[test]
fn no_error_says_its_cause_twice() {
    let not_json = serde_json::from_str::<serde_json::Value>("{").expect_err("not JSON");
    let errors: Vec<Box<dyn Error>> = vec![
        Box::new(BundleError::from(oci_spec::OciSpecError::Other(
            "no process".into(),
        ))),
        Box::new(DiskError::Io {
            path: "/run/x/disk.img".into(),
            source: system(),
        }),
        Box::new(EgressError::Write {
            path: "/proc/sys/net/ipv4/ip_forward".into(),
            source: system(),
        }),
        Box::new(EgressError::Conntrack {
            address: [10, 0, 0, 2].into(),
            source: system(),
        }),
        Box::new(GcError::Io {
            path: "/store/gc.lock".into(),
            source: system(),
        }),
        Box::new(HostError::Pin {
            dir: "/images/demo".into(),
            source: DigestError::Form("x".into()),
        }),
        Box::new(LayoutError::Json {
            what: "manifest",
            digest: digest(),
            source: not_json,
        }),
        Box::new(LayoutError::Io {
            path: "/images/demo/index.json".into(),
            source: system(),
        }),
        Box::new(NetworkError::Open {
            path: "/run/netns/x".into(),
            source: system(),
        }),
        Box::new(layer()),
        Box::new(StoreError::Io {
            path: "/store".into(),
            source: system(),
        }),
        Box::new(UnpackError::Archive(system())),
        Box::new(FetchError::Tls(TlsError::Read {
            path: "/etc/ssl/certs/ca-certificates.crt".into(),
            source: system().into(),
        })),
        Box::new(UnpackError::Root {
            path: "/store/x/rootfs".into(),
            source: system(),
        }),
        Box::new(templates()),
    ];
    for error in &errors {
        assert_cause_said_once(error.as_ref());
    }
}

/// The store's disk templates, refused by the system.
fn templates() -> HostError {
    HostError::Templates(DiskError::Io {
        path: "/store/disks".into(),
        source: system(),
    })
}

#[test]
fn the_disk_templates_refused_are_said_down_to_the_system_error() {
    // The host said this as "the store's disk templates: {error}", which
    // printed the path alone: DiskError's words leave the system's error
    // to its source.
    assert_eq!(
        Chain(&templates()).to_string(),
        format!(
            "cannot run containers: the store's disk templates cannot be made: /store/disks: {}",
            system()
        )
    );
}

#[test]
fn a_refused_layer_is_said_down_to_the_system_error() {
    assert_eq!(
        Chain(&HostError::Store(layer())).to_string(),
        format!(
            "layer 2 ({}): cannot unpack entry \"etc/passwd\": {}",
            digest(),
            system()
        )
    );
}
