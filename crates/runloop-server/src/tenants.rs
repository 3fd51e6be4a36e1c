//! The roster: the tenants as the server serves them — which tenant each
//! token is, and what each tenant may hold now (protocol §3, §12 "Fair
//! shares").
//!
//! The configured [`Tenants`] are resolved once into a table: every
//! token's hash beside its tenant's [`Identity`], and each tenant's
//! [`Shares`]. A reload ([`Roster::replace`]) builds a new table and puts
//! it in place whole; an authorization, a run's claim or a loop's reads
//! the table as it is at that moment, so a reload applies from the next of
//! each on, and never half.
//!
//! The admission and the run ledger ask the roster what a tenant may hold
//! ([`Roster::shares`]): it is the one place that decides a tenant's
//! shares. With any credential accepted every caller is one identity,
//! `anonymous`, with no share of its own: the server-wide limits are its
//! limits.
//!
//! A reload that removes a tenant, or one of a tenant's tokens, revokes
//! the connections that token authorized (protocol §12 "Revocation"):
//! each token's [`Identity`] carries a cancellation, kept by a reload for
//! a token that stays with its tenant and fired for one that goes. A
//! revoked identity has no share at all — never the defaults, never
//! another's — so every run or loop it asks for is refused
//! ([`Revoked`]), and its connection, told by the cancellation, is closed
//! once the revocation grace is over.
//!
//! What a quota comes to on a given server is the configuration's to say
//! ([`Shares::of`]); the roster is handed that resolution, so that it knows
//! nothing of the configuration and the parts that ask it sit above it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use runloop_metrics::ServerMetrics;
use runloop_wire::limits::LimitError;

use super::identity::{ANONYMOUS, Identity, Quota, Shares, TenantError, Tenants, TokenHash};

/// The tenants of a server, as served, behind their own lock.
#[derive(Debug)]
pub(crate) struct Roster {
    /// The one identity of every caller when any credential is accepted;
    /// `None` when callers are tenants of tokens, each held to its shares.
    anonymous: Option<Identity>,
    /// The tenants, as last installed; replaced whole by a reload.
    table: RwLock<Arc<Table>>,
}

/// The tenants resolved for serving: every token's hash with its tenant's
/// identity, and each tenant's shares.
#[derive(Debug)]
struct Table {
    tokens: Vec<(TokenHash, Identity)>,
    shares: BTreeMap<Arc<str>, Shares>,
    /// What a tenant's quota leaves out comes to (what the reload's lines
    /// compare); never the share of a tenant no longer configured.
    defaults: Shares,
}

/// Why a connection's tenant holds nothing new: a reload removed the token
/// that authorized it, or its tenant. Its words are the `policy` error of
/// every run and loop it asks for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tenant {0}'s credential was revoked by a reload (its token or the tenant was removed): \
     this connection opens no more runs or loops, and is closed once the revocation grace is over"
)]
pub(crate) struct Revoked(pub(crate) String);

/// Tenants a reload may install: they validate, and the server has tokens
/// ([`Roster::check`]).
#[derive(Debug)]
pub(crate) struct Checked(Tenants);

/// The per-identity limits a reload of the tenants may change: what a
/// tenant holds when neither its quota nor the defaults say (each still
/// at most its fair share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerIdentity {
    /// `max_connections_per_identity`.
    pub max_connections: usize,
    /// `max_runs_per_identity`.
    pub max_runs: usize,
    /// `max_loops_per_identity`.
    pub max_loops: usize,
}

/// Why a reload of the tenants was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantChange {
    /// The tenants do not validate.
    #[error(transparent)]
    Invalid(#[from] TenantError),
    /// A per-identity limit below its minimum.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The server accepts any credential; tokens need a restart.
    #[error(
        "this server was started without tokens (any credential accepted); tokens and tenants need a restart"
    )]
    Any,
}

impl Roster {
    /// The roster of `tenants` (`None`: any credential is accepted), each
    /// quota resolved by `resolve`, each tenant counting into its figures
    /// of `metrics`.
    pub(crate) fn new(
        tenants: Option<Tenants>,
        resolve: impl Fn(&Quota) -> Shares,
        metrics: &ServerMetrics,
    ) -> Roster {
        let anonymous = tenants
            .is_none()
            .then(|| Identity::new(Arc::from(ANONYMOUS), metrics.tenant(ANONYMOUS)));
        Roster {
            anonymous,
            table: RwLock::new(Arc::new(Table::new(tenants.as_ref(), &resolve, metrics))),
        }
    }

    /// The tenants, as last installed.
    fn table(&self) -> Arc<Table> {
        Arc::clone(
            &self
                .table
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// The tenant `credential` is served as, if it is accepted (see
    /// [`TokenHash::find`]).
    pub(crate) fn accept(&self, credential: &str) -> Option<Identity> {
        if let Some(anonymous) = &self.anonymous {
            return Some(anonymous.clone());
        }
        TokenHash::find(credential, &self.table().tokens).cloned()
    }

    /// What `identity`'s tenant may hold now, when callers are tenants of
    /// tokens; `None` with any credential accepted, when the server-wide
    /// limits are the only ones. An identity a reload revoked holds
    /// nothing new: that is the error, whatever else is configured.
    pub(crate) fn shares(&self, identity: &Identity) -> Result<Option<Shares>, Revoked> {
        if self.anonymous.is_some() {
            return Ok(None);
        }
        let revoked = || Revoked(identity.name().to_owned());
        if identity.is_revoked() {
            return Err(revoked());
        }
        // A tenant the table does not name was removed by the reload now
        // revoking its tokens: revoked already, never a fallback.
        let table = self.table();
        table
            .shares
            .get(identity.name())
            .copied()
            .map(Some)
            .ok_or_else(revoked)
    }

    /// Every tenant's shares, by name (none with any credential accepted).
    pub(crate) fn all_shares(&self) -> Vec<(String, Shares)> {
        self.table()
            .shares
            .iter()
            .map(|(name, shares)| (name.to_string(), *shares))
            .collect()
    }

    /// Whether `tenants` may replace these: they validate, and the server
    /// was started with tokens.
    pub(crate) fn check(&self, tenants: Tenants) -> Result<Checked, TenantChange> {
        if self.anonymous.is_some() {
            return Err(TenantChange::Any);
        }
        tenants.validate()?;
        Ok(Checked(tenants))
    }

    /// Replaces the tenants with `tenants`, from the next authorization
    /// and the next claim on, each quota resolved by `resolve`: what
    /// changed, a line each. A token that stays with its tenant keeps its
    /// revocation; one that goes (or whose tenant goes) is revoked, once
    /// the new table is in place.
    pub(crate) fn replace(
        &self,
        Checked(tenants): Checked,
        resolve: impl Fn(&Quota) -> Shares,
        metrics: &ServerMetrics,
    ) -> Vec<String> {
        let mut table = Table::new(Some(&tenants), &resolve, metrics);
        let mut installed = self
            .table
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut before: HashMap<TokenHash, &Identity> = HashMap::new();
        for (hash, identity) in &installed.tokens {
            before.entry(*hash).or_insert(identity);
        }
        for (hash, identity) in &mut table.tokens {
            if let Some(older) = before.get(hash).filter(|o| o.name() == identity.name()) {
                identity.carry(older);
            }
        }
        let changes = table.changes(&installed);
        let old = std::mem::replace(&mut *installed, Arc::new(table));
        for (hash, identity) in &old.tokens {
            let stays = installed
                .tokens
                .iter()
                .any(|(h, now)| h == hash && now.name() == identity.name());
            if !stays {
                identity.revocation().cancel();
            }
        }
        changes
    }
}

impl Table {
    fn new(
        tenants: Option<&Tenants>,
        resolve: &impl Fn(&Quota) -> Shares,
        metrics: &ServerMetrics,
    ) -> Table {
        let defaults = tenants.map(|t| t.defaults).unwrap_or_default();
        let mut tokens = Vec::new();
        let mut shares = BTreeMap::new();
        for tenant in tenants.iter().flat_map(|t| &t.tenants) {
            let name: Arc<str> = Arc::from(tenant.name.as_str());
            let figures = metrics.tenant(&name);
            // An identity per token: each token is revoked on its own.
            for token in &tenant.tokens {
                let identity = Identity::new(Arc::clone(&name), Arc::clone(&figures));
                tokens.push((*token, identity));
            }
            shares.insert(name, resolve(&tenant.quota.or(defaults)));
        }
        Table {
            tokens,
            shares,
            defaults: resolve(&defaults),
        }
    }

    /// The hashes of tenant `name`'s tokens.
    fn hashes(&self, name: &str) -> Vec<TokenHash> {
        self.tokens
            .iter()
            .filter(|(_, identity)| identity.name() == name)
            .map(|(hash, _)| *hash)
            .collect()
    }

    /// What changed from `old` to this table, a line each, naming
    /// tenants, counts of tokens and shares — never a token or a hash.
    fn changes(&self, old: &Table) -> Vec<String> {
        let mut lines = Vec::new();
        for (name, shares) in &self.shares {
            let now = self.hashes(name);
            match old.shares.get(name) {
                None => lines.push(format!("tenant {name} added with {} token(s)", now.len())),
                Some(before) => {
                    let then = old.hashes(name);
                    let added = now.iter().filter(|h| !then.contains(h)).count();
                    let removed = then.iter().filter(|h| !now.contains(h)).count();
                    if removed > 0 {
                        lines.push(format!(
                            "tenant {name}: {added} token(s) added, {removed} removed \
                             (its connections of a removed token are revoked)"
                        ));
                    } else if added > 0 {
                        lines.push(format!("tenant {name}: {added} token(s) added, 0 removed"));
                    }
                    for ((key, value), (_, was)) in shares.keyed().iter().zip(before.keyed()) {
                        if *value != was {
                            lines.push(format!("tenant {name}: {key} {was} -> {value}"));
                        }
                    }
                }
            }
        }
        for name in old.shares.keys() {
            if !self.shares.contains_key(name) {
                lines.push(format!(
                    "tenant {name} removed: its connections are revoked (no new run or loop; \
                     closed after the revocation grace), new ones are refused"
                ));
            }
        }
        for ((key, value), (_, was)) in self.defaults.keyed().iter().zip(old.defaults.keyed()) {
            if *value != was {
                lines.push(format!("tenant-defaults: {key} {was} -> {value}"));
            }
        }
        lines
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::identity::{Credentials, Tenant};

    /// A quota resolved against a small server: two of everything, 1 GiB
    /// of memory and disk, unless the quota says.
    pub(crate) fn resolve(quota: &Quota) -> Shares {
        Shares {
            max_connections: quota.max_connections.unwrap_or(2),
            max_runs: quota.max_runs.unwrap_or(2),
            max_loops: quota.max_loops.unwrap_or(2),
            memory_budget: quota.memory_budget.unwrap_or(1 << 30),
            disk_budget: quota.disk_budget.unwrap_or(1 << 30),
            max_run_memory: quota.max_run_memory.unwrap_or(1 << 30),
            max_pulls: quota.max_pulls.unwrap_or(2),
            cpu_weight: quota.cpu_weight.unwrap_or(100),
        }
    }

    /// The roster of `credentials`, resolved by [`resolve`].
    pub(crate) fn roster(credentials: &Credentials) -> Roster {
        Roster::new(credentials.tenants(), resolve, &ServerMetrics::new())
    }

    fn tenant(name: &str, tokens: &[&str], quota: Quota) -> Tenant {
        Tenant {
            name: name.into(),
            tokens: tokens.iter().map(|t| TokenHash::of(t)).collect(),
            quota,
        }
    }

    fn named(identity: Option<Identity>) -> Option<String> {
        identity.map(|identity| identity.name().to_owned())
    }

    #[test]
    fn tokens_are_matched_and_named_by_position() {
        let roster = roster(&Credentials::Tokens(vec!["alpha".into(), "beta".into()]));
        assert_eq!(named(roster.accept("beta")).as_deref(), Some("token #2"));
        assert_eq!(roster.accept("gamma"), None);
        assert_eq!(roster.accept(""), None);
        assert_eq!(roster.accept("alph"), None);
        let anyone = tests::roster(&Credentials::Any);
        assert_eq!(named(anyone.accept("")).as_deref(), Some("anonymous"));
    }

    #[test]
    fn a_tenant_is_found_by_the_hash_of_its_token() {
        // printf %s alpha | sha256sum
        let hash = "sha256:8ed3f6ad685b959ead7022518e1af76cd816f8e8ec7ccdda1ed4018e8f2223f8";
        let tenants = Tenants {
            defaults: Quota::default(),
            tenants: vec![Tenant {
                name: "alice".into(),
                tokens: vec![TokenHash::parse(hash).expect("a hash")],
                quota: Quota::default(),
            }],
        };
        let roster = roster(&Credentials::Tenants(tenants));
        assert_eq!(named(roster.accept("alpha")).as_deref(), Some("alice"));
        assert_eq!(roster.accept("beta"), None);
    }

    #[test]
    fn without_tokens_every_caller_is_anonymous_and_has_no_share() {
        let roster = roster(&Credentials::Any);
        let anyone = roster.accept("whatever").expect("any credential");
        assert_eq!(anyone.name(), ANONYMOUS);
        assert_eq!(roster.shares(&anyone), Ok(None));
        assert!(roster.all_shares().is_empty());
        assert_eq!(
            roster.check(Tenants::from_tokens(["a"])).err(),
            Some(TenantChange::Any)
        );
    }

    #[test]
    fn a_tenants_shares_are_its_quota_over_the_defaults() {
        let tenants = Tenants {
            defaults: Quota {
                max_runs: Some(5),
                ..Quota::default()
            },
            tenants: vec![
                tenant("alice", &["a"], Quota::default()),
                tenant(
                    "bob",
                    &["b"],
                    Quota {
                        max_runs: Some(1),
                        max_loops: Some(7),
                        ..Quota::default()
                    },
                ),
            ],
        };
        let roster = roster(&Credentials::Tenants(tenants));
        let shares = |token| {
            let identity = roster.accept(token).expect("a tenant");
            roster
                .shares(&identity)
                .expect("not revoked")
                .expect("counted")
        };
        assert_eq!((shares("a").max_runs, shares("a").max_loops), (5, 2));
        assert_eq!((shares("b").max_runs, shares("b").max_loops), (1, 7));
        let all: Vec<(String, usize)> = roster
            .all_shares()
            .into_iter()
            .map(|(name, shares)| (name, shares.max_runs))
            .collect();
        assert_eq!(all, [("alice".into(), 5), ("bob".into(), 1)]);
    }

    #[test]
    fn a_reload_replaces_tokens_and_shares_and_says_what_changed() {
        let before = Tenants {
            defaults: Quota::default(),
            tenants: vec![
                tenant("alice", &["a"], Quota::default()),
                tenant("bob", &["b"], Quota::default()),
            ],
        };
        let roster = roster(&Credentials::Tenants(before));
        let alice = roster.accept("a").expect("alice");
        let after = Tenants {
            defaults: Quota {
                max_loops: Some(3),
                ..Quota::default()
            },
            tenants: vec![
                tenant(
                    "alice",
                    &["a2"],
                    Quota {
                        max_runs: Some(1),
                        ..Quota::default()
                    },
                ),
                tenant("carol", &["c", "c2"], Quota::default()),
            ],
        };
        let checked = roster.check(after).expect("valid");
        let changes = roster.replace(checked, resolve, &ServerMetrics::new());
        assert_eq!(
            changes,
            [
                "tenant alice: 1 token(s) added, 1 removed (its connections of a removed token \
                 are revoked)",
                "tenant alice: max-runs 2 -> 1",
                "tenant alice: max-loops 2 -> 3",
                "tenant carol added with 2 token(s)",
                "tenant bob removed: its connections are revoked (no new run or loop; closed \
                 after the revocation grace), new ones are refused",
                "tenant-defaults: max-loops 2 -> 3",
            ]
        );
        assert_eq!(roster.accept("a"), None);
        assert_eq!(roster.accept("b"), None);
        assert_eq!(named(roster.accept("a2")).as_deref(), Some("alice"));
        assert_eq!(named(roster.accept("c2")).as_deref(), Some("carol"));
        // Its token removed, an identity authorized before the reload
        // holds nothing: revoked, never the new shares or the defaults.
        assert_eq!(roster.shares(&alice), Err(Revoked("alice".into())));
        assert!(alice.is_revoked());
        // Nothing that does not validate is installed.
        let twice = Tenants {
            defaults: Quota::default(),
            tenants: vec![
                tenant("dave", &["d"], Quota::default()),
                tenant("dave", &["e"], Quota::default()),
            ],
        };
        assert_eq!(
            roster.check(twice).err(),
            Some(TenantChange::Invalid(TenantError::Duplicate("dave".into())))
        );
        assert_eq!(named(roster.accept("a2")).as_deref(), Some("alice"));
    }

    #[test]
    fn a_reload_revokes_the_tokens_it_removes_and_keeps_the_rest() {
        let quota = |max_runs| Quota {
            max_runs: Some(max_runs),
            ..Quota::default()
        };
        let before = Tenants {
            defaults: Quota::default(),
            tenants: vec![
                tenant("alice", &["a1", "a2"], quota(1)),
                tenant("bob", &["b"], Quota::default()),
                tenant("carol", &["c"], Quota::default()),
            ],
        };
        let roster = roster(&Credentials::Tenants(before));
        let accept = |token| roster.accept(token).expect("a token");
        let (a1, a2, bob, carol) = (accept("a1"), accept("a2"), accept("b"), accept("c"));
        // alice loses a2 and gets a larger share; bob goes; carol's token
        // moves to dave.
        let after = Tenants {
            defaults: quota(9),
            tenants: vec![
                tenant("alice", &["a1"], quota(3)),
                tenant("dave", &["c"], Quota::default()),
            ],
        };
        let checked = roster.check(after).expect("valid");
        roster.replace(checked, resolve, &ServerMetrics::new());
        let runs = |identity: &Identity| roster.shares(identity).map(|s| s.map(|s| s.max_runs));
        assert_eq!(runs(&a1), Ok(Some(3)), "a1 stays, with alice's new share");
        assert!(!a1.is_revoked());
        for (identity, name) in [(&a2, "alice"), (&bob, "bob"), (&carol, "carol")] {
            assert!(identity.is_revoked(), "{name}");
            assert_eq!(
                runs(identity),
                Err(Revoked(name.into())),
                "never the defaults"
            );
        }
        // A later reload that keeps a1 keeps it unrevoked; one that brings
        // bob back does not unrevoke the connections it revoked.
        let again = Tenants {
            defaults: Quota::default(),
            tenants: vec![
                tenant("alice", &["a1"], quota(3)),
                tenant("bob", &["b"], Quota::default()),
            ],
        };
        let checked = roster.check(again).expect("valid");
        roster.replace(checked, resolve, &ServerMetrics::new());
        assert!(!a1.is_revoked() && !accept("a1").is_revoked());
        assert!(bob.is_revoked() && !accept("b").is_revoked());
        let words = Revoked("bob".into()).to_string();
        assert!(
            words.starts_with("tenant bob's credential was revoked"),
            "{words}"
        );
    }
}
