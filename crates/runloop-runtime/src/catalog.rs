//! The catalog: which runtime serves which `server` image name (protocol §12).
//!
//! Only `server` images from the catalog are run. An entry may pin a
//! digest, and then any other digest is refused; an unpinned entry accepts
//! any well-formed digest (the request's digest grammar is checked before
//! the catalog is asked). Refusals name the image, so the caller learns
//! exactly what was not accepted, and say what would be: a name the
//! catalog lacks is answered with a few of the names it has, and a pinned
//! entry asked for with no digest (the all-zero [`UNPINNED`] a caller
//! sends when it names none) with the reference to ask for instead.
//!
//! Entries are written on the command line as agent specs:
//!
//! ```text
//! NAME[@DIGEST]=builtin:demo                 the demo agent, in-process       (Builtin)
//! NAME[@DIGEST]=exec:PROGRAM [ARGS…]         a child process on $PORT         (Exec)
//! NAME[@DIGEST]=proxy:ws://HOST:PORT         a proxy that already runs        (Attach)
//! NAME[@DIGEST]=oci:DIR                      an OCI image layout, in a container (runloop-oci)
//! ```
//!
//! `NAME` is a repository path without a host and `DIGEST` is `sha256:`
//! and 64 lowercase hex digits, in the request's own grammar, so an entry can only name
//! an image a request could ask for. Exec arguments are split on
//! whitespace, with no quoting. A spec that does not parse says which part
//! is wrong and what was expected.
//!
//! An `oci:` entry needs more than its spec to run: a container host (a
//! store, an address pool, runc), which the catalog does not have. Its
//! spec parses here like the others, and whoever holds a host (`runloop
//! serve`) turns it into a runtime and [`Catalog::insert`]s it;
//! [`Catalog::add`] refuses it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use runloop_proto::agents_run::{ImageRef, UNPINNED, is_valid_digest, is_valid_name};
use tokio_tungstenite::tungstenite::http::Uri;

use super::{Attach, Builtin, Exec, ExecConfig, Runtime};

/// One catalog entry as written on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// The `server` image name it serves.
    pub name: String,
    /// The only digest accepted, when pinned.
    pub digest: Option<String>,
    /// What runs the image.
    pub runtime: RuntimeSpec,
}

/// The runtime half of an agent spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeSpec {
    /// `builtin:AGENT`: an agent of this crate, in-process.
    Builtin(String),
    /// `exec:PROGRAM [ARGS…]`: a child process.
    Exec {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// `proxy:ws://HOST:PORT`: a proxy that already runs.
    Proxy(String),
    /// `oci:DIR`: an OCI image layout, run in a container by a container host.
    Oci(PathBuf),
}

/// Why an agent spec does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// No `=` between the image and the runtime.
    #[error(
        "agent spec {0:?} has no `=`: expected NAME[@DIGEST]=builtin:demo, NAME[@DIGEST]=exec:PROGRAM [ARGS…], NAME[@DIGEST]=proxy:ws://HOST:PORT or NAME[@DIGEST]=oci:DIR"
    )]
    NoEquals(String),
    /// The name is not a repository path without a host.
    #[error("image name {0:?} is not a repository path without a host (such as agents/demo)")]
    Name(String),
    /// The digest is not one runloop takes (`DIGEST_RULE`).
    #[error("digest {0:?} is not sha256: followed by 64 lowercase hex digits")]
    Digest(String),
    /// The runtime has no `KIND:`.
    #[error("runtime {0:?} has no kind: expected builtin:, exec:, proxy: or oci:")]
    NoKind(String),
    /// The kind is none of the four.
    #[error("unknown runtime kind {0:?}: expected builtin, exec, proxy or oci")]
    Kind(String),
    /// `builtin:` names an agent this crate does not have.
    #[error("unknown builtin agent {0:?}: the builtin agents are: demo")]
    Builtin(String),
    /// `exec:` with no program.
    #[error("exec: needs a program")]
    NoProgram,
    /// `oci:` with no directory.
    #[error("oci: needs an OCI image layout directory")]
    NoLayout,
    /// An `oci:` spec given to [`Catalog::add`], which has no container host.
    #[error("{0} runs an OCI image, which needs a container host: runloop serve sets one up")]
    NeedsHost(String),
    /// `proxy:` with a URL that is not `ws://HOST:PORT`.
    #[error("proxy URL {url:?} is not ws://HOST:PORT: {why}")]
    ProxyUrl {
        /// The URL as written.
        url: String,
        /// What is wrong with it.
        why: String,
    },
}

impl FromStr for AgentSpec {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<AgentSpec, SpecError> {
        let (image, runtime) = spec
            .split_once('=')
            .ok_or_else(|| SpecError::NoEquals(spec.to_owned()))?;
        let (name, digest) = match image.split_once('@') {
            Some((name, digest)) => (name, Some(digest)),
            None => (image, None),
        };
        if !is_valid_name(name) {
            return Err(SpecError::Name(name.to_owned()));
        }
        if let Some(digest) = digest.filter(|digest| !is_valid_digest(digest)) {
            return Err(SpecError::Digest(digest.to_owned()));
        }
        Ok(AgentSpec {
            name: name.to_owned(),
            digest: digest.map(str::to_owned),
            runtime: runtime.parse()?,
        })
    }
}

impl FromStr for RuntimeSpec {
    type Err = SpecError;

    fn from_str(runtime: &str) -> Result<RuntimeSpec, SpecError> {
        let (kind, rest) = runtime
            .split_once(':')
            .ok_or_else(|| SpecError::NoKind(runtime.to_owned()))?;
        match kind {
            "builtin" => match rest {
                "demo" => Ok(RuntimeSpec::Builtin(rest.to_owned())),
                other => Err(SpecError::Builtin(other.to_owned())),
            },
            "exec" => {
                let mut words = rest.split_whitespace().map(str::to_owned);
                let program = words.next().ok_or(SpecError::NoProgram)?;
                Ok(RuntimeSpec::Exec {
                    program,
                    args: words.collect(),
                })
            }
            "proxy" => {
                check_proxy_url(rest).map_err(|why| SpecError::ProxyUrl {
                    url: rest.to_owned(),
                    why: why.to_owned(),
                })?;
                Ok(RuntimeSpec::Proxy(rest.trim_end_matches('/').to_owned()))
            }
            "oci" if rest.trim().is_empty() => Err(SpecError::NoLayout),
            "oci" => Ok(RuntimeSpec::Oci(PathBuf::from(rest))),
            other => Err(SpecError::Kind(other.to_owned())),
        }
    }
}

/// Whether `url` is `ws://HOST:PORT` with nothing after it but a `/`.
fn check_proxy_url(url: &str) -> Result<(), &'static str> {
    let uri: Uri = url.parse().map_err(|_| "it does not parse as a URL")?;
    if uri.scheme_str() != Some("ws") {
        return Err("the scheme must be ws");
    }
    let authority = uri.authority().ok_or("it has no host")?;
    if authority.host().is_empty() {
        return Err("it has no host");
    }
    if authority.port_u16().is_none() {
        return Err("it has no port");
    }
    if authority.as_str().contains('@') {
        return Err("it carries credentials");
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("it has a path or a query; the server adds /agent/register and /agent/run");
    }
    Ok(())
}

impl AgentSpec {
    /// A runtime that serves this spec, an `exec:` one configured as
    /// `exec`; `None` for `oci:`, which needs a container host.
    pub fn build(&self, exec: &ExecConfig) -> Option<Arc<dyn Runtime>> {
        Some(match &self.runtime {
            // The parser admits `demo` alone.
            RuntimeSpec::Builtin(_) => Arc::new(Builtin::demo()),
            RuntimeSpec::Exec { program, args } => {
                Arc::new(Exec::new(program.clone(), args.clone()).with_config(exec.clone()))
            }
            RuntimeSpec::Proxy(url) => Arc::new(Attach::new(url.clone())),
            RuntimeSpec::Oci(_) => return None,
        })
    }
}

/// The spec as it would be written on the command line.
impl fmt::Display for AgentSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        match &self.runtime {
            RuntimeSpec::Builtin(agent) => write!(f, "=builtin:{agent}"),
            RuntimeSpec::Exec { program, args } => {
                write!(f, "=exec:{program}")?;
                args.iter().try_for_each(|arg| write!(f, " {arg}"))
            }
            RuntimeSpec::Proxy(url) => write!(f, "=proxy:{url}"),
            RuntimeSpec::Oci(dir) => write!(f, "=oci:{}", dir.display()),
        }
    }
}

/// How many of its names a refusal of an unknown name lists.
const NAMES_LISTED: usize = 4;

/// Why the catalog will not run an image; the message goes to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// No entry for the name.
    #[error("image {name:?} is not in this server's catalog, {}", served(.serves, *.more))]
    UnknownImage {
        /// The requested name.
        name: String,
        /// The first names the catalog serves, in order (four at most).
        serves: Vec<String>,
        /// How many more it serves.
        more: usize,
    },
    /// The entry pins a digest, and the request named none.
    #[error(
        "image {name:?} is pinned to {pinned}: ask for it by that digest (the request's image \
         digest: RunRequest::server({name:?}).digest(…) in the Rust client, digest=\"{pinned}\" \
         in Python's client.start, {name}@{pinned} on runloop run's command line)"
    )]
    Unpinned {
        /// The requested name.
        name: String,
        /// The digest the entry pins.
        pinned: String,
    },
    /// The entry pins another digest.
    #[error("image {name:?} is pinned to {pinned}; {requested} is refused")]
    WrongDigest {
        /// The requested name.
        name: String,
        /// The digest the entry pins.
        pinned: String,
        /// The digest the request named.
        requested: String,
    },
}

/// The names a catalog serves, as a refusal lists them.
fn served(names: &[String], more: usize) -> String {
    let quoted: Vec<String> = names.iter().map(|name| format!("{name:?}")).collect();
    match (quoted.as_slice(), more) {
        ([], _) => "which is empty".to_owned(),
        ([one], 0) => format!("which serves {one}"),
        ([first @ .., last], 0) => format!("which serves {} and {last}", first.join(", ")),
        (all, more) => format!("which serves {} and {more} more", all.join(", ")),
    }
}

#[derive(Debug, Clone)]
struct Entry {
    digest: Option<String>,
    runtime: Arc<dyn Runtime>,
}

/// Image names mapped to runtimes.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    entries: BTreeMap<String, Entry>,
    exec: ExecConfig,
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Catalog::default()
    }

    /// A catalog whose `exec:` entries [`add`](Catalog::add)ed from now on
    /// are configured as `exec`.
    pub fn with_exec(mut self, exec: ExecConfig) -> Self {
        self.exec = exec;
        self
    }

    /// Serves `name` with `runtime`, pinned to `digest` when given. A second
    /// entry for a name replaces the first.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        digest: Option<String>,
        runtime: Arc<dyn Runtime>,
    ) {
        self.entries.insert(name.into(), Entry { digest, runtime });
    }

    /// The catalog a server has when none is given: `demo=builtin:demo`.
    pub fn demo() -> Self {
        let mut catalog = Catalog::new();
        catalog.insert("demo", None, Arc::new(Builtin::demo()));
        catalog
    }

    /// Serves an agent spec; a second entry for a name replaces the first.
    /// An `oci:` spec is refused: it needs a container host, which builds
    /// its runtime for [`Catalog::insert`].
    pub fn add(&mut self, spec: AgentSpec) -> Result<(), SpecError> {
        let runtime = spec
            .build(&self.exec)
            .ok_or_else(|| SpecError::NeedsHost(spec.to_string()))?;
        self.insert(spec.name, spec.digest, runtime);
        Ok(())
    }

    /// The runtime for `image`, or why there is none.
    pub fn resolve(&self, image: &ImageRef) -> Result<Arc<dyn Runtime>, CatalogError> {
        let entry = self
            .entries
            .get(&image.name)
            .ok_or_else(|| CatalogError::UnknownImage {
                name: image.name.clone(),
                serves: self.entries.keys().take(NAMES_LISTED).cloned().collect(),
                more: self.entries.len().saturating_sub(NAMES_LISTED),
            })?;
        match &entry.digest {
            Some(pinned) if image.digest == UNPINNED => Err(CatalogError::Unpinned {
                name: image.name.clone(),
                pinned: pinned.clone(),
            }),
            Some(pinned) if *pinned != image.digest => Err(CatalogError::WrongDigest {
                name: image.name.clone(),
                pinned: pinned.clone(),
                requested: image.digest.clone(),
            }),
            _ => Ok(Arc::clone(&entry.runtime)),
        }
    }

    /// The names served, in order, with their pinned digests.
    pub fn names(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.entries
            .iter()
            .map(|(name, entry)| (name.as_str(), entry.digest.as_deref()))
    }

    /// The images whose runtime, as configured, will refuse the runs
    /// callers usually ask for, each with why ([`Runtime::caveat`]).
    pub fn caveats(&self) -> impl Iterator<Item = (&str, String)> {
        self.entries
            .iter()
            .filter_map(|(name, entry)| Some((name.as_str(), entry.runtime.caveat()?)))
    }

    /// Whether no image is served.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(name: &str, digest: &str) -> ImageRef {
        ImageRef {
            name: name.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn resolve_by_name_and_pin() {
        let pinned = format!("sha256:{}", "a".repeat(64));
        let other = format!("sha256:{}", "b".repeat(64));
        let mut catalog = Catalog::new();
        catalog.insert("free", None, Arc::new(Attach::new("ws://127.0.0.1:1")));
        catalog.insert(
            "pinned",
            Some(pinned.clone()),
            Arc::new(Attach::new("ws://127.0.0.1:2")),
        );
        assert!(catalog.resolve(&image("free", &other)).is_ok());
        assert!(catalog.resolve(&image("pinned", &pinned)).is_ok());
        let wrong = catalog
            .resolve(&image("pinned", &other))
            .expect_err("pinned");
        assert_eq!(
            wrong.to_string(),
            format!("image \"pinned\" is pinned to {pinned}; {other} is refused")
        );
        let unknown = catalog
            .resolve(&image("nope", &other))
            .expect_err("unknown");
        assert_eq!(
            unknown.to_string(),
            "image \"nope\" is not in this server's catalog, which serves \"free\" and \"pinned\""
        );
        let unpinned = catalog
            .resolve(&image("pinned", UNPINNED))
            .expect_err("pinned");
        assert_eq!(
            unpinned.to_string(),
            format!(
                "image \"pinned\" is pinned to {pinned}: ask for it by that digest (the request's \
                 image digest: RunRequest::server(\"pinned\").digest(…) in the Rust client, \
                 digest=\"{pinned}\" in Python's client.start, pinned@{pinned} on runloop run's \
                 command line)"
            )
        );
        assert_eq!(
            catalog.names().collect::<Vec<_>>(),
            [("free", None), ("pinned", Some(pinned.as_str()))]
        );
    }

    #[test]
    fn an_unknown_name_is_answered_with_a_few_of_the_names_served() {
        let unknown = |catalog: &Catalog| {
            catalog
                .resolve(&image("reverse", UNPINNED))
                .expect_err("unknown")
                .to_string()
        };
        let mut catalog = Catalog::new();
        assert_eq!(
            unknown(&catalog),
            "image \"reverse\" is not in this server's catalog, which is empty"
        );
        catalog.insert("rev", None, Arc::new(Builtin::demo()));
        assert_eq!(
            unknown(&catalog),
            "image \"reverse\" is not in this server's catalog, which serves \"rev\""
        );
        for name in ["a", "b", "c", "d", "e", "f"] {
            catalog.insert(name, None, Arc::new(Builtin::demo()));
        }
        assert_eq!(
            unknown(&catalog),
            "image \"reverse\" is not in this server's catalog, which serves \"a\", \"b\", \"c\", \"d\" \
             and 3 more"
        );
    }

    fn parse(spec: &str) -> Result<AgentSpec, String> {
        spec.parse::<AgentSpec>().map_err(|error| error.to_string())
    }

    #[test]
    fn specs_parse_into_runtimes() {
        let digest = format!("sha256:{}", "c".repeat(64));
        assert_eq!(
            parse("demo=builtin:demo"),
            Ok(AgentSpec {
                name: "demo".into(),
                digest: None,
                runtime: RuntimeSpec::Builtin("demo".into()),
            })
        );
        assert_eq!(
            parse(&format!(
                "agents/echo@{digest}=exec:python3  agent.py --x=1 "
            )),
            Ok(AgentSpec {
                name: "agents/echo".into(),
                digest: Some(digest.clone()),
                runtime: RuntimeSpec::Exec {
                    program: "python3".into(),
                    args: vec!["agent.py".into(), "--x=1".into()],
                },
            })
        );
        assert_eq!(
            parse("far=proxy:ws://10.0.0.7:14979/"),
            Ok(AgentSpec {
                name: "far".into(),
                digest: None,
                runtime: RuntimeSpec::Proxy("ws://10.0.0.7:14979".into()),
            })
        );
        assert_eq!(
            parse("agents/boxed=oci:/srv/images/boxed"),
            Ok(AgentSpec {
                name: "agents/boxed".into(),
                digest: None,
                runtime: RuntimeSpec::Oci("/srv/images/boxed".into()),
            })
        );
        for spec in [
            "demo=builtin:demo".to_owned(),
            format!("a/b@{digest}=exec:prog -v x"),
            "far=proxy:ws://[::1]:14979".to_owned(),
            format!("boxed@{digest}=oci:images/boxed"),
        ] {
            assert_eq!(parse(&spec).expect("parses").to_string(), spec);
        }
    }

    #[test]
    fn spec_errors_say_what_is_wrong() {
        let cases = [
            (
                "demo",
                "agent spec \"demo\" has no `=`: expected NAME[@DIGEST]=builtin:demo, NAME[@DIGEST]=exec:PROGRAM [ARGS…], NAME[@DIGEST]=proxy:ws://HOST:PORT or NAME[@DIGEST]=oci:DIR",
            ),
            (
                "Demo=builtin:demo",
                "image name \"Demo\" is not a repository path without a host (such as agents/demo)",
            ),
            (
                "reg.io/demo=builtin:demo",
                "image name \"reg.io/demo\" is not a repository path without a host (such as agents/demo)",
            ),
            (
                "demo@sha256:abc=builtin:demo",
                "digest \"sha256:abc\" is not sha256: followed by 64 lowercase hex digits",
            ),
            (
                "demo@md5:0123=builtin:demo",
                "digest \"md5:0123\" is not sha256: followed by 64 lowercase hex digits",
            ),
            (
                "demo=demo",
                "runtime \"demo\" has no kind: expected builtin:, exec:, proxy: or oci:",
            ),
            (
                "demo=docker:x",
                "unknown runtime kind \"docker\": expected builtin, exec, proxy or oci",
            ),
            (
                "demo=builtin:echo",
                "unknown builtin agent \"echo\": the builtin agents are: demo",
            ),
            ("demo=exec:  ", "exec: needs a program"),
            ("demo=oci:", "oci: needs an OCI image layout directory"),
            (
                "demo=proxy:http://h:1",
                "proxy URL \"http://h:1\" is not ws://HOST:PORT: the scheme must be ws",
            ),
            (
                "demo=proxy:wss://h:1",
                "proxy URL \"wss://h:1\" is not ws://HOST:PORT: the scheme must be ws",
            ),
            (
                "demo=proxy:ws://h",
                "proxy URL \"ws://h\" is not ws://HOST:PORT: it has no port",
            ),
            (
                "demo=proxy:ws://h:1/agent/run",
                "proxy URL \"ws://h:1/agent/run\" is not ws://HOST:PORT: it has a path or a query; the server adds /agent/register and /agent/run",
            ),
            (
                "demo=proxy:ws://u:p@h:1",
                "proxy URL \"ws://u:p@h:1\" is not ws://HOST:PORT: it carries credentials",
            ),
            (
                "demo=proxy:not a url",
                "proxy URL \"not a url\" is not ws://HOST:PORT: it does not parse as a URL",
            ),
        ];
        for (spec, message) in cases {
            assert_eq!(parse(spec), Err(message.to_owned()), "{spec}");
        }
    }

    #[test]
    fn add_and_demo() {
        let pinned = format!("sha256:{}", "d".repeat(64));
        let other = format!("sha256:{}", "e".repeat(64));
        let mut catalog = Catalog::demo();
        assert_eq!(catalog.names().collect::<Vec<_>>(), [("demo", None)]);
        assert!(catalog.resolve(&image("demo", &other)).is_ok());
        catalog
            .add(
                format!("demo@{pinned}=proxy:ws://127.0.0.1:1")
                    .parse()
                    .expect("parses"),
            )
            .expect("added");
        let boxed: AgentSpec = "boxed=oci:/srv/boxed".parse().expect("parses");
        assert_eq!(
            catalog.add(boxed).map_err(|error| error.to_string()),
            Err("boxed=oci:/srv/boxed runs an OCI image, which needs a container host: runloop serve sets one up".to_owned())
        );
        assert_eq!(
            catalog.names().collect::<Vec<_>>(),
            [("demo", Some(pinned.as_str()))]
        );
        assert!(catalog.resolve(&image("demo", &pinned)).is_ok());
        assert!(matches!(
            catalog.resolve(&image("demo", &other)),
            Err(CatalogError::WrongDigest { .. })
        ));
    }
}
