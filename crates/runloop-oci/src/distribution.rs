//! Registry requests: the manifest and blob `GET`s of the OCI distribution
//! API and the anonymous bearer-token exchange, made so that a registry can
//! neither send the server to another host nor make it hold more in memory
//! than the caller allows.
//!
//! A registry is someone else's server, and any caller may name any tag on
//! it, so every answer is treated as hostile:
//!
//! - **No redirect for a manifest or a token.** A manifest is read from the
//!   registry the reference names or not at all; a `3xx` answer is an error
//!   naming where it pointed.
//! - **Blob redirects only to listed hosts.** A blob may be redirected (at
//!   most [`MAX_HOPS`] times) to the registry itself or to a host the
//!   operator listed as a mirror (`--registry-mirror`, for a blob CDN), and
//!   to nothing else. A mirror listed by name is connected only at public
//!   addresses — never loopback, private, link-local, shared (CGNAT) or
//!   multicast ones — so that a name cannot be pointed at the host's own
//!   network; a mirror on such an address is listed by that address. The
//!   token and `Authorization` never go with a redirect.
//! - **A token realm at a public address.** The `realm` of a
//!   `WWW-Authenticate: Bearer` challenge is asked over HTTPS (HTTP only for
//!   a plain-HTTP registry), at a public address unless its host is the
//!   registry or a listed mirror.
//! - **No proxy but the operator's.** The environment's `HTTP_PROXY`,
//!   `HTTPS_PROXY` and `ALL_PROXY` are not used: through a proxy, the proxy
//!   resolves the names, and a mirror's or a realm's name would reach the
//!   proxy's network unchecked. A proxy named by the operator
//!   (`--registry-proxy`) carries every request; the names of mirrors and
//!   realms that must be public are then resolved here first, and refused
//!   unless every address they have is public (the proxy resolves them
//!   again: its own rules are the last word).
//! - **Every body read into memory is capped.** Manifests, token answers
//!   and error answers are read through [`read_capped`]: refused at once when
//!   their declared `Content-Length` is over the cap, and when the bytes
//!   read pass it, whatever was declared. Blobs are never read into memory:
//!   the caller streams them to the store.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, LOCATION, WWW_AUTHENTICATE};
use reqwest::{Client, Response, StatusCode, Url};
use runloop_wire::tls::ClientTls;
use tracing::warn;

/// Redirects one blob request may take.
pub const MAX_HOPS: usize = 3;
/// The largest token or error answer read, bytes.
pub const MAX_SMALL_BODY: u64 = 64 << 10;

/// Where an image's requests go: the registry and repository of a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The registry as the operator's list writes it (`HOST[:PORT]`).
    pub registry: String,
    /// The host the requests go to (`docker.io` becomes `index.docker.io`).
    pub endpoint: String,
    /// The repository (`library/alpine`).
    pub repository: String,
}

/// Why a registry request failed. Everything in it that came from the
/// registry is as the registry sent it; log it through an escaping writer.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The registry has no such manifest or blob (404, or an error code
    /// that says so).
    #[error("not found: the registry answered {0}")]
    NotFound(String),
    /// Any other answer than the one asked for.
    #[error("the registry answered {0}")]
    Status(String),
    /// A redirect this server does not follow.
    #[error("the registry redirected to {location}, which is not followed: {why}")]
    Redirect {
        /// Where it pointed, as sent.
        location: String,
        /// Which rule refused it.
        why: String,
    },
    /// A body over its cap.
    #[error("{what} is larger than {max} bytes{}", declared.map(|d| format!(" (it declares {d})")).unwrap_or_default())]
    TooLarge {
        /// What was being read.
        what: &'static str,
        /// The cap.
        max: u64,
        /// The length the answer declared, when it was over the cap.
        declared: Option<u64>,
    },
    /// The token exchange.
    #[error("cannot get a pull token: {0}")]
    Token(String),
    /// The connection or the HTTP exchange: reqwest's error, whose causes
    /// (the connection's, TLS's) come through its source.
    #[error(transparent)]
    Http(reqwest::Error),
    /// TLS settings could not be made.
    #[error("cannot make the registry client's TLS settings")]
    Tls(#[source] runloop_wire::tls::TlsError),
}

/// A manifest as the registry sent it.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Its bytes, at most the cap asked for.
    pub bytes: Vec<u8>,
    /// Its `Docker-Content-Digest`, when the registry sent one.
    pub digest: Option<String>,
    /// Its `Content-Type`, when the registry sent one.
    pub media_type: Option<String>,
}

/// The HTTP side of registry pulls, shared by every pull of a server.
pub struct Distribution {
    /// Registry hosts: the operator named them, so any address goes.
    direct: Client,
    /// Mirrors and token realms: public addresses only, unless listed by address.
    public: Client,
    insecure: Vec<String>,
    mirrors: Vec<String>,
    /// Whether requests go through the operator's proxy.
    proxied: bool,
    /// The last token per registry and repository.
    tokens: Mutex<HashMap<(String, String), Arc<str>>>,
}

/// Which client a request to a host goes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// The registry: any address.
    Registry,
    /// A mirror or a realm: public addresses, unless listed by address.
    Public,
}

impl fmt::Debug for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Distribution")
            .field("insecure", &self.insecure)
            .field("mirrors", &self.mirrors)
            .field("proxied", &self.proxied)
            .finish()
    }
}

impl Distribution {
    /// Requests with these timeouts (to connect; between two reads), over
    /// plain HTTP to the `insecure` registries, with blob redirects allowed
    /// to the `mirrors`, through `proxy` (a URL) when given and never
    /// through the environment's.
    pub fn new(
        insecure: Vec<String>,
        mirrors: Vec<String>,
        proxy: Option<&str>,
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> Result<Distribution, FetchError> {
        let proxy = proxy
            .map(reqwest::Proxy::all)
            .transpose()
            .map_err(FetchError::Http)?;
        // The process's one TLS stack: rustls with `ring` and the platform's
        // roots, as the WebSocket client has. Without roots, registries
        // over HTTPS fail at the handshake (unknown issuer), said at once
        // here; insecure (plain HTTP) registries go on.
        runloop_wire::tls::install_default_provider();
        let (tls, no_roots) = ClientTls::platform_or_none().map_err(FetchError::Tls)?;
        if let Some(why) = no_roots {
            warn!(%why, "no trust roots for registries over HTTPS: each pull from one will fail");
        }
        let builder = || {
            let builder = Client::builder()
                .tls_backend_preconfigured(tls.rustls_config())
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(connect_timeout)
                .read_timeout(read_timeout)
                .user_agent(concat!("runloop/", env!("CARGO_PKG_VERSION")));
            match &proxy {
                Some(proxy) => builder.proxy(proxy.clone()),
                None => builder.no_proxy(),
            }
        };
        let direct = builder().build().map_err(FetchError::Http)?;
        let public = builder()
            .dns_resolver(Arc::new(PublicOnly))
            .build()
            .map_err(FetchError::Http)?;
        Ok(Distribution {
            direct,
            public,
            insecure,
            mirrors,
            proxied: proxy.is_some(),
            tokens: Mutex::new(HashMap::new()),
        })
    }

    fn client(&self, reach: Reach) -> &Client {
        match reach {
            Reach::Registry => &self.direct,
            Reach::Public => &self.public,
        }
    }

    /// Through the operator's proxy, which resolves names itself: whether
    /// the name of `url`, which must be public, resolves here to public
    /// addresses only. An address written as such was listed by the
    /// operator (a mirror) or checked by the caller (a realm).
    async fn screen(&self, url: &Url) -> Result<(), String> {
        if !self.proxied {
            return Ok(());
        }
        let Some(host) = url.host_str() else {
            return Err("it names no host".to_owned());
        };
        if host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok() {
            return Ok(());
        }
        let port = url.port_or_known_default().unwrap_or(443);
        let found: Vec<IpAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|error| format!("{host} does not resolve: {error}"))?
            .map(|addr| addr.ip())
            .collect();
        match found.iter().find(|ip| !is_public(**ip)) {
            _ if found.is_empty() => Err(format!("{host} resolves to no address")),
            Some(ip) => Err(format!(
                "{host} resolves to {ip}, which is not a public address (through --registry-proxy, \
                 a mirror on a private address is listed by its address)"
            )),
            None => Ok(()),
        }
    }

    fn base(&self, target: &Target) -> Result<Url, FetchError> {
        let scheme = if self.insecure.contains(&target.registry) {
            "http"
        } else {
            "https"
        };
        let text = format!("{scheme}://{}/v2/{}/", target.endpoint, target.repository);
        Url::parse(&text).map_err(|error| FetchError::Status(format!("a bad URL {text}: {error}")))
    }

    /// The manifest (or index) `reference` (a tag or a digest) of `target`,
    /// at most `max` bytes. A redirect is refused.
    pub async fn manifest(
        &self,
        target: &Target,
        reference: &str,
        accept: &[&str],
        max: u64,
    ) -> Result<Fetched, FetchError> {
        let url = join(&self.base(target)?, &format!("manifests/{reference}"))?;
        let response = self.get(target, url, &accept.join(", ")).await?;
        let status = response.status();
        if status.is_redirection() {
            return Err(FetchError::Redirect {
                location: location(&response),
                why: "a manifest is read from the registry itself".into(),
            });
        }
        if !status.is_success() {
            return Err(failure(response).await);
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let digest = header("docker-content-digest");
        let media_type = header(CONTENT_TYPE.as_str());
        let bytes = read_capped(response, max, "the manifest").await?;
        Ok(Fetched {
            bytes,
            digest,
            media_type,
        })
    }

    /// The blob `digest` of `target`, answered `200` and ready to stream,
    /// after the redirects the rules allow.
    pub async fn blob(&self, target: &Target, digest: &str) -> Result<Response, FetchError> {
        let url = join(&self.base(target)?, &format!("blobs/{digest}"))?;
        let mut response = self.get(target, url, "*/*").await?;
        let mut hops = 0;
        while response.status().is_redirection() {
            hops += 1;
            let sent = location(&response);
            let refuse = |why: String| FetchError::Redirect {
                location: sent.clone(),
                why,
            };
            if hops > MAX_HOPS {
                return Err(refuse(format!("more than {MAX_HOPS} redirects")));
            }
            let next = response
                .url()
                .join(&sent)
                .map_err(|error| refuse(format!("not a URL: {error}")))?;
            let reach = self
                .redirect_client(target, response.url(), &next)
                .map_err(refuse)?;
            if reach == Reach::Public {
                self.screen(&next).await.map_err(refuse)?;
            }
            response = self
                .client(reach)
                .get(next)
                .send()
                .await
                .map_err(FetchError::Http)?;
        }
        if !response.status().is_success() {
            return Err(failure(response).await);
        }
        Ok(response)
    }

    /// The client a blob redirect from `from` to `to` is fetched with, or
    /// why it is not followed.
    fn redirect_client(&self, target: &Target, from: &Url, to: &Url) -> Result<Reach, String> {
        let host = authority(to).ok_or_else(|| "it names no host".to_owned())?;
        let is = |name: &String| name.eq_ignore_ascii_case(&host);
        let registry = is(&target.registry) || is(&target.endpoint);
        let mirror = self.mirrors.iter().any(is);
        if !registry && !mirror {
            return Err(format!(
                "{host} is neither the registry nor a mirror this server was given (--registry-mirror)"
            ));
        }
        match to.scheme() {
            "https" => {}
            "http" if from.scheme() == "http" || self.insecure.iter().any(is) => {}
            other => return Err(format!("its scheme {other} is not https")),
        }
        Ok(if registry {
            Reach::Registry
        } else {
            Reach::Public
        })
    }

    /// A `GET` of the registry, with its token; a `401` with a bearer
    /// challenge gets a token and is asked once more.
    async fn get(&self, target: &Target, url: Url, accept: &str) -> Result<Response, FetchError> {
        let key = (target.registry.clone(), target.repository.clone());
        let cached = self
            .tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&key)
            .cloned();
        let send = |token: Option<Arc<str>>| {
            let mut request = self.direct.get(url.clone()).header(ACCEPT, accept);
            if let Some(token) = token {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            request.send()
        };
        let response = send(cached).await.map_err(FetchError::Http)?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let Some(challenge) = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| Challenge::parse(value, target))
        else {
            return Ok(response);
        };
        let token: Arc<str> = self.token(target, &url, &challenge).await?.into();
        self.tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key, Arc::clone(&token));
        send(Some(token)).await.map_err(FetchError::Http)
    }

    /// An anonymous pull token from the challenge's realm.
    async fn token(
        &self,
        target: &Target,
        asked: &Url,
        challenge: &Challenge,
    ) -> Result<String, FetchError> {
        let mut realm = Url::parse(&challenge.realm)
            .map_err(|error| FetchError::Token(format!("realm {:?}: {error}", challenge.realm)))?;
        let host = authority(&realm).ok_or_else(|| {
            FetchError::Token(format!("realm {:?} names no host", challenge.realm))
        })?;
        let is = |name: &String| name.eq_ignore_ascii_case(&host);
        let listed = is(&target.registry) || is(&target.endpoint) || self.mirrors.iter().any(is);
        match realm.scheme() {
            "https" => {}
            "http" if asked.scheme() == "http" => {}
            other => {
                return Err(FetchError::Token(format!(
                    "realm {:?}: its scheme {other} is not https",
                    challenge.realm
                )));
            }
        }
        let literal = realm
            .host_str()
            .and_then(|name| name.trim_matches(['[', ']']).parse::<IpAddr>().ok());
        if !listed
            && let Some(ip) = literal
            && !is_public(ip)
        {
            return Err(FetchError::Token(format!(
                "realm {:?} is at {ip}, which is not a public address",
                challenge.realm
            )));
        }
        {
            let mut query = realm.query_pairs_mut();
            if let Some(service) = &challenge.service {
                query.append_pair("service", service);
            }
            query.append_pair("scope", &challenge.scope);
        }
        let reach = if listed {
            Reach::Registry
        } else {
            self.screen(&realm)
                .await
                .map_err(|why| FetchError::Token(format!("realm {:?}: {why}", challenge.realm)))?;
            Reach::Public
        };
        let response = self
            .client(reach)
            .get(realm)
            .send()
            .await
            .map_err(FetchError::Http)?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Token(format!("the realm answered {status}")));
        }
        let bytes = read_capped(response, MAX_SMALL_BODY, "the token answer").await?;
        #[derive(serde::Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(&bytes)
            .map_err(|error| FetchError::Token(format!("the answer is not JSON: {error}")))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|token| !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| FetchError::Token("the answer holds no usable token".into()))
    }
}

/// A `WWW-Authenticate: Bearer` challenge.
struct Challenge {
    realm: String,
    service: Option<String>,
    scope: String,
}

impl Challenge {
    fn parse(header: &str, target: &Target) -> Option<Challenge> {
        let challenges = http_auth::parse_challenges(header).ok()?;
        let bearer = challenges
            .iter()
            .find(|c| c.scheme.eq_ignore_ascii_case("bearer"))?;
        let param = |name: &str| {
            bearer
                .params
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.to_unescaped())
        };
        Some(Challenge {
            realm: param("realm")?,
            service: param("service"),
            scope: param("scope")
                .unwrap_or_else(|| format!("repository:{}:pull", target.repository)),
        })
    }
}

/// `HOST[:PORT]` of a URL, as the operator's lists write it.
fn authority(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

fn join(base: &Url, path: &str) -> Result<Url, FetchError> {
    base.join(path)
        .map_err(|error| FetchError::Status(format!("a bad URL {base}{path}: {error}")))
}

/// The `Location` of a redirect, as sent (escaped for showing).
fn location(response: &Response) -> String {
    match response.headers().get(LOCATION) {
        Some(value) => String::from_utf8_lossy(value.as_bytes()).into_owned(),
        None => format!("nowhere ({} without a Location)", response.status()),
    }
}

/// The error an answer other than success is: its status and, when the
/// registry sent the distribution API's error JSON, its first code.
async fn failure(response: Response) -> FetchError {
    let status = response.status();
    let body = read_capped(response, MAX_SMALL_BODY, "the error answer")
        .await
        .unwrap_or_default();
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: String,
    }
    let code = serde_json::from_slice::<Envelope>(&body)
        .ok()
        .and_then(|envelope| envelope.errors.into_iter().next())
        .map(|entry| entry.code);
    let text = match &code {
        Some(code) => format!("{status} ({code})"),
        None => status.to_string(),
    };
    let missing = matches!(
        code.as_deref(),
        Some("MANIFEST_UNKNOWN" | "NAME_UNKNOWN" | "BLOB_UNKNOWN")
    );
    if status == StatusCode::NOT_FOUND || missing {
        FetchError::NotFound(text)
    } else {
        FetchError::Status(text)
    }
}

/// The body of `response`, refused at once when it declares more than
/// `max` bytes and as soon as more than `max` arrive, whatever it declared.
pub async fn read_capped(
    mut response: Response,
    max: u64,
    what: &'static str,
) -> Result<Vec<u8>, FetchError> {
    if let Some(declared) = response.content_length()
        && declared > max
    {
        return Err(FetchError::TooLarge {
            what,
            max,
            declared: Some(declared),
        });
    }
    let mut bytes = Vec::new();
    while let Some(piece) = response.chunk().await.map_err(FetchError::Http)? {
        if (bytes.len() + piece.len()) as u64 > max {
            return Err(FetchError::TooLarge {
                what,
                max,
                declared: None,
            });
        }
        bytes.extend_from_slice(&piece);
    }
    Ok(bytes)
}

/// Whether an address is one on the public internet: not loopback,
/// private, link-local, shared (CGNAT), multicast, documentation,
/// benchmarking, reserved or unspecified.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || first & 0xfe00 == 0xfc00 // unique local
                || first & 0xffc0 == 0xfe80 // link-local
                || first & 0xffc0 == 0xfec0 // site-local (deprecated)
                || (first == 0x2001 && v6.segments()[1] == 0x0db8) // documentation
                || first == 0x0064 && v6.segments()[1] == 0xff9b // NAT64 of any v4
                || v6 == Ipv6Addr::from_bits(1))
        }
    }
}

fn is_public_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    !(v4.is_private()
        || v4.is_loopback()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_broadcast()
        || v4.is_documentation()
        || v4.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240)
}

/// A resolver that keeps only public addresses: names given by a registry
/// (token realms) or by the operator (mirrors) never reach the host's own
/// network through DNS.
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = found
                .into_iter()
                .filter(|addr| is_public(addr.ip()))
                .collect();
            if public.is_empty() {
                return Err(format!(
                    "{host} resolves to no public address (a mirror on a private address is listed by its address)"
                )
                .into());
            }
            let addrs: Addrs = Box::new(public.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_addresses_are_told_from_the_hosts_own() {
        for private in [
            "127.0.0.1",
            "127.0.0.2",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(private.parse().expect("ip")), "{private}");
        }
        for public in ["1.1.1.1", "8.8.8.8", "2606:4700::1111", "100.128.0.1"] {
            assert!(is_public(public.parse().expect("ip")), "{public}");
        }
    }
}
