//! Identities: which credentials the server accepts and which tenant a
//! connection is served as (protocol §3, §12 "Fair shares"), kept apart
//! from the rest of the configuration so that the roster, the admission
//! and the budget can name a tenant without depending on the whole of it.
//!
//! A tenant is a name (for logs and metrics), the tokens it is served for,
//! and its quotas. Tokens are held as their SHA-256 only: a configuration
//! file can name a token by its hash (`sha256:HEX`) without holding the
//! secret, and a credential is hashed once and compared with every hash
//! the server knows, in constant time, whatever matches
//! ([`TokenHash::find`], the one token match).

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use runloop_metrics::TenantFigures;

/// Which credentials the server accepts (protocol §3).
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Any credential, empty included: every caller is one tenant,
    /// `anonymous`, held by the server-wide limits alone. Only sensible on
    /// a loopback address; the `runloop serve` command refuses it anywhere
    /// else.
    Any,
    /// One of these tokens, each a tenant of its own named by its
    /// position (`token #1`…) with the default quotas.
    Tokens(Vec<String>),
    /// The tokens of these tenants.
    Tenants(Tenants),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Any => f.write_str("Any"),
            Credentials::Tokens(tokens) => write!(f, "Tokens(<{} redacted>)", tokens.len()),
            Credentials::Tenants(tenants) => write!(f, "Tenants({tenants:?})"),
        }
    }
}

/// The SHA-256 of a token's bytes: how the server holds and compares it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// The hash of `token`.
    pub fn of(token: &str) -> TokenHash {
        TokenHash(Sha256::digest(token.as_bytes()).into())
    }

    /// Reads `sha256:HEX`, HEX being 64 lowercase hexadecimal digits.
    pub fn parse(text: &str) -> Result<TokenHash, TokenHashError> {
        let hex = text.strip_prefix("sha256:").ok_or(TokenHashError)?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(TokenHashError);
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| TokenHashError)?;
        }
        Ok(TokenHash(bytes))
    }
}

impl TokenHash {
    /// The value beside the hash of `credential` among `known`, if it is
    /// there: the token match, the one the server runs. The credential is
    /// hashed once, and its hash compared with every known one, each in
    /// constant time and all of them whatever matched, so how long it
    /// takes says nothing of which hash matched, or how much of one
    /// (protocol §3). The first match is the one found.
    pub(crate) fn find<'a, T>(
        credential: &str,
        known: impl IntoIterator<Item = &'a (TokenHash, T)>,
    ) -> Option<&'a T>
    where
        T: 'a,
    {
        let hash = TokenHash::of(credential);
        let mut found = None;
        for (token, value) in known {
            let equal: bool = token.0.ct_eq(&hash.0).into();
            if equal && found.is_none() {
                found = Some(value);
            }
        }
        found
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:<redacted>")
    }
}

/// A token hash that is not `sha256:` and 64 lowercase hexadecimal digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a token hash is \"sha256:\" and 64 lowercase hexadecimal digits")]
pub struct TokenHashError;

/// What one tenant may hold at once. A value left out is the
/// [`Tenants::defaults`]' and, when those leave it out too, the server's
/// fair share: half of its memory budget, disk budget, runs and
/// connections (rounded down, never below one), its per-identity loop
/// limit and its largest run memory. A value given is the tenant's, up to
/// the server-wide limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Authorized connections at once.
    pub max_connections: Option<usize>,
    /// Runs at once.
    pub max_runs: Option<usize>,
    /// Loops (run-loop channels) at once, over all its runs.
    pub max_loops: Option<usize>,
    /// The `memory` of its runs together, bytes.
    pub memory_budget: Option<u64>,
    /// The `disk` of its runs together, bytes.
    pub disk_budget: Option<u64>,
    /// The largest `memory` one of its runs may ask for, bytes.
    pub max_run_memory: Option<u64>,
    /// Registry pulls under way at once.
    pub max_pulls: Option<usize>,
    /// The CPU weight its runs share (1 to 10000, cgroup v2's scale); left
    /// out: the server's `tenant_cpu_weight`, the same for every tenant.
    pub cpu_weight: Option<u32>,
}

impl Quota {
    /// This quota, with what it leaves out taken from `defaults`.
    pub fn or(self, defaults: Quota) -> Quota {
        Quota {
            max_connections: self.max_connections.or(defaults.max_connections),
            max_runs: self.max_runs.or(defaults.max_runs),
            max_loops: self.max_loops.or(defaults.max_loops),
            memory_budget: self.memory_budget.or(defaults.memory_budget),
            disk_budget: self.disk_budget.or(defaults.disk_budget),
            max_run_memory: self.max_run_memory.or(defaults.max_run_memory),
            max_pulls: self.max_pulls.or(defaults.max_pulls),
            cpu_weight: self.cpu_weight.or(defaults.cpu_weight),
        }
    }
}

/// One tenant: its name, its tokens' hashes and its quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Its name in logs, metrics and refusals.
    pub name: String,
    /// The hashes of the tokens it is served for.
    pub tokens: Vec<TokenHash>,
    /// What it may hold.
    pub quota: Quota,
}

/// The tenants a server serves, and the quota of those that set none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    /// What a tenant's quota leaves out.
    pub defaults: Quota,
    /// Every tenant, each with a distinct name.
    pub tenants: Vec<Tenant>,
}

/// Why a set of tenants cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// Two tenants have the same name.
    #[error("two tenants are named {0:?}")]
    Duplicate(String),
    /// A name that is empty or would not read well in a log or a label.
    #[error(
        "tenant name {0:?} is not 1 to 64 letters, digits, '-', '_' or '.' (it goes in logs and metric labels)"
    )]
    Name(String),
    /// One token given to two tenants.
    #[error("a token is given to both tenant {0:?} and tenant {1:?}")]
    SharedToken(String, String),
    /// A quota below its minimum.
    #[error("tenant {tenant:?}: {key} is {value}, below its minimum of {minimum}")]
    Quota {
        /// The tenant (`tenant-defaults` for the defaults).
        tenant: String,
        /// The quota's key.
        key: &'static str,
        /// Its value.
        value: u64,
        /// Its minimum.
        minimum: u64,
    },
    /// The name the server gives to callers when any credential is accepted.
    #[error("tenant name \"anonymous\" is kept for the callers of a server without tokens")]
    Anonymous,
}

impl Tenants {
    /// Every token a tenant of its own, named by its position, with the
    /// default quota.
    pub fn from_tokens<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Tenants {
        Tenants {
            defaults: Quota::default(),
            tenants: tokens
                .into_iter()
                .enumerate()
                .map(|(index, token)| Tenant {
                    name: format!("token #{}", index + 1),
                    tokens: vec![TokenHash::of(token)],
                    quota: Quota::default(),
                })
                .collect(),
        }
    }

    /// Whether the names are distinct and readable, no token is given
    /// twice and every quota is at least its minimum (one connection, run
    /// or loop; [`Limit::MIN_RUN_MEMORY`](runloop_wire::limits::Limit::MIN_RUN_MEMORY)
    /// of memory); the first fault found is the error.
    pub fn validate(&self) -> Result<(), TenantError> {
        check_quota("tenant-defaults", &self.defaults)?;
        for tenant in &self.tenants {
            check_quota(&tenant.name, &tenant.quota)?;
        }
        for (index, tenant) in self.tenants.iter().enumerate() {
            let readable = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            // `token #N` is the name the server gives a lone token.
            let lone_token = tenant
                .name
                .strip_prefix("token #")
                .is_some_and(|n| n.parse::<usize>().is_ok());
            if !lone_token
                && (tenant.name.is_empty()
                    || tenant.name.len() > 64
                    || !tenant.name.chars().all(readable))
            {
                return Err(TenantError::Name(tenant.name.clone()));
            }
            if tenant.name == ANONYMOUS {
                return Err(TenantError::Anonymous);
            }
            for other in &self.tenants[..index] {
                if other.name == tenant.name {
                    return Err(TenantError::Duplicate(tenant.name.clone()));
                }
                if tenant.tokens.iter().any(|t| other.tokens.contains(t)) {
                    return Err(TenantError::SharedToken(
                        other.name.clone(),
                        tenant.name.clone(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether each value `quota` gives is at least its minimum.
fn check_quota(tenant: &str, quota: &Quota) -> Result<(), TenantError> {
    let memory = runloop_wire::limits::Limit::MIN_RUN_MEMORY;
    let values = [
        (
            "max-connections",
            quota.max_connections.map(|v| v as u64),
            1,
        ),
        ("max-runs", quota.max_runs.map(|v| v as u64), 1),
        ("max-loops", quota.max_loops.map(|v| v as u64), 1),
        ("max-pulls", quota.max_pulls.map(|v| v as u64), 1),
        ("memory-budget", quota.memory_budget, memory),
        ("max-run-memory", quota.max_run_memory, memory),
        ("cpu-weight", quota.cpu_weight.map(u64::from), 1),
    ];
    for (key, value, minimum) in values {
        if let Some(value) = value
            && value < minimum
        {
            return Err(TenantError::Quota {
                tenant: tenant.to_owned(),
                key,
                value,
                minimum,
            });
        }
    }
    Ok(())
}

impl Credentials {
    /// The tenants these credentials name; `None` when any credential is
    /// accepted.
    pub fn tenants(&self) -> Option<Tenants> {
        match self {
            Credentials::Any => None,
            Credentials::Tokens(tokens) => {
                Some(Tenants::from_tokens(tokens.iter().map(|t| t.as_str())))
            }
            Credentials::Tenants(tenants) => Some(tenants.clone()),
        }
    }
}

/// The tenant of every caller of a server that accepts any credential.
pub const ANONYMOUS: &str = "anonymous";

/// The tenant a connection is served as, with its figures. It names the
/// tenant, never the credential, so it can be logged; equal when the names
/// are.
///
/// It also carries the revocation of the token it was accepted for: one
/// per token, fired by the reload that removes the token or its tenant
/// (protocol §12 "Revocation"), so that every connection the token
/// authorized learns of it at once, without asking.
#[derive(Clone)]
pub struct Identity {
    name: Arc<str>,
    pub(crate) figures: Arc<TenantFigures>,
    revoked: CancellationToken,
}

impl Identity {
    /// The tenant named `name`, counting into `figures`, not revoked.
    pub(crate) fn new(name: Arc<str>, figures: Arc<TenantFigures>) -> Identity {
        Identity {
            name,
            figures,
            revoked: CancellationToken::new(),
        }
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Fires when a reload removes the token this identity was accepted
    /// for, or its tenant.
    pub(crate) fn revocation(&self) -> &CancellationToken {
        &self.revoked
    }

    /// Whether a reload removed its token or its tenant.
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }

    /// Takes `older`'s revocation: the same token, kept by a reload.
    pub(crate) fn carry(&mut self, older: &Identity) {
        self.revoked = older.revoked.clone();
    }
}

impl PartialEq for Identity {
    fn eq(&self, other: &Identity) -> bool {
        self.name == other.name
    }
}

impl Eq for Identity {}

impl std::hash::Hash for Identity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({:?})", self.name)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// What one tenant may hold at once: its [`Quota`] resolved against the
/// server's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// Authorized connections.
    pub max_connections: usize,
    /// Runs.
    pub max_runs: usize,
    /// Loops, over all its runs.
    pub max_loops: usize,
    /// The `memory` of its runs together, bytes.
    pub memory_budget: u64,
    /// The `disk` of its runs together, bytes.
    pub disk_budget: u64,
    /// The largest `memory` of one run, bytes.
    pub max_run_memory: u64,
    /// Registry pulls under way at once.
    pub max_pulls: usize,
    /// The CPU weight its runs share.
    pub cpu_weight: u32,
}

impl Shares {
    /// Each share by its key, as a configuration file names it.
    pub fn keyed(&self) -> [(&'static str, u64); 8] {
        [
            ("max-connections", self.max_connections as u64),
            ("max-runs", self.max_runs as u64),
            ("max-loops", self.max_loops as u64),
            ("memory-budget", self.memory_budget),
            ("disk-budget", self.disk_budget),
            ("max-run-memory", self.max_run_memory),
            ("max-pulls", self.max_pulls as u64),
            ("cpu-weight", u64::from(self.cpu_weight)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_found_by_its_hash_and_nothing_else() {
        let known = [
            (TokenHash::of("alpha"), 1),
            (TokenHash::of("beta"), 2),
            (TokenHash::of("alpha"), 3),
        ];
        assert_eq!(TokenHash::find("beta", &known), Some(&2));
        // The first of two equal hashes is the one found.
        assert_eq!(TokenHash::find("alpha", &known), Some(&1));
        for other in ["", "alph", "alphaa", "Alpha", "beta "] {
            assert_eq!(TokenHash::find(other, &known), None, "{other:?}");
        }
        let none: [(TokenHash, u8); 0] = [];
        assert_eq!(TokenHash::find("alpha", &none), None);
    }

    #[test]
    fn a_token_hash_is_sha256_and_lowercase_hex() {
        let hex = "ab".repeat(32);
        assert!(TokenHash::parse(&format!("sha256:{hex}")).is_ok());
        for bad in [
            hex.clone(),
            format!("sha256:{}", hex.to_uppercase()),
            format!("sha256:{}", &hex[1..]),
            format!("sha512:{hex}"),
            format!("sha256:{}zz", &hex[2..]),
        ] {
            assert_eq!(TokenHash::parse(&bad), Err(TokenHashError), "{bad}");
        }
    }

    #[test]
    fn names_tokens_and_duplicates_are_checked() {
        let tenant = |name: &str, token: &str| Tenant {
            name: name.into(),
            tokens: vec![TokenHash::of(token)],
            quota: Quota::default(),
        };
        let of = |tenants: Vec<Tenant>| Tenants {
            defaults: Quota::default(),
            tenants,
        };
        assert_eq!(
            of(vec![tenant("alice", "a"), tenant("bob", "b")]).validate(),
            Ok(())
        );
        assert_eq!(
            of(vec![tenant("alice", "a"), tenant("alice", "b")]).validate(),
            Err(TenantError::Duplicate("alice".into()))
        );
        assert_eq!(
            of(vec![tenant("alice", "a"), tenant("bob", "a")]).validate(),
            Err(TenantError::SharedToken("alice".into(), "bob".into()))
        );
        for name in ["", "a b", "al\"ice", &"x".repeat(65)] {
            assert_eq!(
                of(vec![tenant(name, "a")]).validate(),
                Err(TenantError::Name(name.into()))
            );
        }
        assert_eq!(
            of(vec![tenant("anonymous", "a")]).validate(),
            Err(TenantError::Anonymous)
        );
    }

    #[test]
    fn debug_never_shows_tokens() {
        let shown = format!("{:?}", Credentials::Tokens(vec!["s3cret".into()]));
        assert!(!shown.contains("s3cret"), "{shown}");
        let shown = format!("{:?}", Credentials::Tokens(vec!["s3cret".into()]).tenants());
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
