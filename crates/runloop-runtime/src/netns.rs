//! Network namespaces of runs: made for a run, held by a descriptor, and
//! reached only by sockets made inside them; and the kernel's socket
//! diagnostics (`sock_diag`), which say who listens on a port without
//! reading the host's socket tables.
//!
//! ```text
//! server's netns                          run's netns (lo only)
//!   maker thread ──setns, socket(), back──▶ a TCP socket of the run's ──connect──▶ agent on 127.0.0.1:$PORT
//!                                          (the proxy's dial, one per call; the readiness probe's)
//!                ──setns, socket(), back──▶ a sock_diag socket of the run's: "who listens on $PORT?"
//! ```
//!
//! Why a namespace per run (protocol §10): an agent listens on
//! `127.0.0.1:$PORT` of its own loopback, and nothing else is there — no
//! other run's agent, no service of the host. The port is the run's own
//! by construction, so no one needs asking who holds it; and a socket
//! keeps the namespace it was made in, so a connection made in it can
//! only ever reach a process of the run.
//!
//! Why one thread makes them: `setns` moves the calling thread, and every
//! socket, file or name lookup that thread makes afterwards is in the
//! run's namespace. A thread of the async runtime's pools would carry it
//! into unrelated work; this one only makes namespaces and sockets, and
//! goes back to the server's namespace after each.
//!
//! Why `sock_diag`: `/proc/net/tcp` lists every socket of the namespace,
//! thousands on a busy host, and is read whole; a `sock_diag` dump asks
//! the kernel for the listeners on one port (a filter it runs itself) and
//! reads a few dozen bytes. In a run's own namespace it is also how
//! readiness is probed: it makes no connection the agent would see.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tracing::warn;

/// A network namespace, held open: what a run's processes join and what
/// the server dials through. The namespace lives while this (or a
/// process in it) does.
#[derive(Debug, Clone)]
pub struct Netns {
    fd: Arc<OwnedFd>,
}

impl Netns {
    /// A new namespace with nothing in it but `lo`, up. Needs
    /// `CAP_SYS_ADMIN` (root).
    pub async fn create() -> io::Result<Netns> {
        let fd = ask(Work::Create).await?;
        Ok(Netns { fd: Arc::new(fd) })
    }

    /// A new namespace as [`Netns::create`] makes it, also bound at `path`
    /// (as `ip netns add` binds one under `/run/netns`): runc joins it
    /// there, and a server started after a crash finds it by its name.
    /// Remove it with [`remove_at`].
    pub async fn create_at(path: &Path) -> io::Result<Netns> {
        let fd = ask(Work::CreateAt(path.to_owned())).await?;
        Ok(Netns { fd: Arc::new(fd) })
    }

    /// The namespace open at `fd` (`/proc/PID/ns/net`, `/run/netns/NAME`).
    pub fn from_fd(fd: OwnedFd) -> Netns {
        Netns { fd: Arc::new(fd) }
    }

    /// Its descriptor: what a process joins (`setns`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// An unconnected TCP socket (IPv4) of the namespace.
    pub async fn socket(&self) -> io::Result<TcpSocket> {
        let fd = ask(Work::Socket(Arc::clone(&self.fd), Kind::Tcp)).await?;
        Ok(TcpSocket::from_std_stream(std::net::TcpStream::from(fd)))
    }

    /// A TCP connection to `127.0.0.1:port` inside the namespace.
    pub async fn connect(&self, port: u16) -> io::Result<TcpStream> {
        let socket = self.socket().await?;
        socket
            .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
    }

    /// The namespace's socket diagnostics.
    pub async fn diag(&self) -> io::Result<Diag> {
        let fd = ask(Work::Socket(Arc::clone(&self.fd), Kind::Diag)).await?;
        Ok(Diag { fd })
    }
}

/// How the proxy reaches an agent program that listens on
/// `127.0.0.1:PORT` in a run's namespace: every call's connection is a
/// socket made there ([`Netns::connect`]), so it lands in the run and
/// nowhere else, and the proxy reads it with nothing between.
#[derive(Debug, Clone)]
pub struct Dialer {
    netns: Netns,
    port: u16,
}

impl Netns {
    /// The proxy's dial to `port` in this namespace.
    pub fn dialer(&self, port: u16) -> Dialer {
        Dialer {
            netns: self.clone(),
            port,
        }
    }
}

impl std::fmt::Display for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "127.0.0.1:{} in the run's network namespace", self.port)
    }
}

impl runloop_proxy::Dial for Dialer {
    fn address(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    fn connect(&self) -> runloop_proxy::Dialing<'_> {
        Box::pin(self.netns.connect(self.port))
    }
}

/// Unbinds the namespace bound at `path` and removes the file (as `ip
/// netns del` does); absent is fine. The namespace itself lives on while
/// a process or a descriptor holds it.
pub fn remove_at(path: &Path) -> io::Result<()> {
    let name = c_path(path)?;
    // SAFETY: umount2 on a NUL-terminated path.
    if unsafe { libc::umount2(name.as_ptr(), libc::MNT_DETACH) } == -1 {
        let error = io::Error::last_os_error();
        // EINVAL: not a mount point (a file left by a crash mid-make).
        if !matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) {
            return Err(error);
        }
    }
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))
}

/// What the maker thread is asked for.
enum Work {
    /// A new namespace, lo up.
    Create,
    /// A new namespace, lo up, bound at this path.
    CreateAt(PathBuf),
    /// A socket in this namespace.
    Socket(Arc<OwnedFd>, Kind),
}

#[derive(Clone, Copy)]
enum Kind {
    Tcp,
    Diag,
}

struct Ask {
    work: Work,
    reply: oneshot::Sender<io::Result<OwnedFd>>,
}

fn gone() -> io::Error {
    io::Error::other("the thread that makes run network namespaces is gone")
}

async fn ask(work: Work) -> io::Result<OwnedFd> {
    let (reply, answer) = oneshot::channel();
    maker()?.send(Ask { work, reply }).map_err(|_| gone())?;
    answer.await.map_err(|_| gone())?
}

/// The maker thread's queue, started on first use.
fn maker() -> io::Result<mpsc::Sender<Ask>> {
    static MAKER: OnceLock<Mutex<Option<mpsc::Sender<Ask>>>> = OnceLock::new();
    let slot = MAKER.get_or_init(|| Mutex::new(None));
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(sender) = slot.as_ref() {
        return Ok(sender.clone());
    }
    // The server's own namespace, to go back to: opened before any setns.
    let home = File::open("/proc/thread-self/ns/net")
        .or_else(|_| File::open("/proc/self/ns/net"))
        .map(OwnedFd::from)?;
    let (sender, asks) = mpsc::channel::<Ask>();
    std::thread::Builder::new()
        .name("runloop-netns".to_owned())
        .spawn(move || {
            for ask in asks {
                let made = match &ask.work {
                    Work::Create => create_here(),
                    Work::CreateAt(path) => create_here().and_then(|fd| {
                        bind_here(path)?;
                        Ok(fd)
                    }),
                    Work::Socket(netns, kind) => socket_in(netns, *kind),
                };
                // SAFETY: setns on a descriptor this thread owns.
                if unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) } == -1 {
                    warn!(error = %io::Error::last_os_error(), "the namespace maker cannot return to the server's network namespace");
                }
                let _ = ask.reply.send(made);
            }
        })?;
    *slot = Some(sender.clone());
    Ok(sender)
}

/// On the maker thread: a new namespace for this thread, `lo` up in it,
/// and its descriptor.
fn create_here() -> io::Result<OwnedFd> {
    // SAFETY: unshare on this thread only (CLONE_NEWNET is per thread).
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } == -1 {
        return Err(io::Error::last_os_error());
    }
    let fd = OwnedFd::from(File::open("/proc/thread-self/ns/net")?);
    loopback_up()?;
    Ok(fd)
}

/// Binds the calling thread's namespace at `path` (its directory made if
/// need be).
fn bind_here(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    File::options()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)?;
    let source = c_path(Path::new("/proc/thread-self/ns/net"))?;
    let target = c_path(path)?;
    // SAFETY: a bind mount of two NUL-terminated paths, no data.
    let bound = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if bound == -1 {
        let error = io::Error::last_os_error();
        let _ = std::fs::remove_file(path);
        return Err(error);
    }
    Ok(())
}

/// Sets `lo` up in the calling thread's namespace.
fn loopback_up() -> io::Result<()> {
    const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
    const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
    let socket = raw_socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // struct ifreq: the name (16 bytes), then a union whose first member
    // here is the flags (a short).
    let mut request = [0u8; 40];
    request[..2].copy_from_slice(b"lo");
    // SAFETY: `request` is the size of a struct ifreq and outlives both calls.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), SIOCGIFFLAGS, request.as_mut_ptr()) == -1 {
            return Err(io::Error::last_os_error());
        }
        let flags = i16::from_ne_bytes([request[16], request[17]]) | libc::IFF_UP as i16;
        request[16..18].copy_from_slice(&flags.to_ne_bytes());
        if libc::ioctl(socket.as_raw_fd(), SIOCSIFFLAGS, request.as_mut_ptr()) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// On the maker thread: enters `netns` and makes a socket of `kind` there.
fn socket_in(netns: &OwnedFd, kind: Kind) -> io::Result<OwnedFd> {
    // SAFETY: setns on a descriptor the caller holds open.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } == -1 {
        let errno = io::Error::last_os_error();
        return Err(io::Error::new(
            errno.kind(),
            format!("cannot enter the run's network namespace: {errno}"),
        ));
    }
    match kind {
        Kind::Tcp => raw_socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0),
        Kind::Diag => raw_socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_SOCK_DIAG),
    }
}

/// `socket(2)`, close-on-exec.
fn raw_socket(
    family: libc::c_int,
    kind: libc::c_int,
    protocol: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: a system call on integers; the descriptor is owned at once.
    let fd = unsafe { libc::socket(family, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A socket that listens, as `sock_diag` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    /// The address it is bound to.
    pub address: IpAddr,
    /// The socket's inode (what `/proc/PID/fd/N` links to as `socket:[N]`).
    pub inode: u32,
}

impl Listening {
    /// Whether a connection to `127.0.0.1` reaches it (bound to the
    /// loopback address, the wildcard, or their IPv6 forms).
    pub fn reached_from_loopback(&self) -> bool {
        match self.address {
            IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST || v4.is_unspecified(),
            IpAddr::V6(v6) => {
                v6.is_unspecified() || v6.to_ipv4_mapped() == Some(Ipv4Addr::LOCALHOST)
            }
        }
    }
}

/// A `sock_diag` socket of one namespace: asks the kernel who listens on
/// a TCP port there.
#[derive(Debug)]
pub struct Diag {
    fd: OwnedFd,
}

/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `INET_DIAG_REQ_BYTECODE`.
const REQ_BYTECODE: u16 = 1;
/// `INET_DIAG_BC_S_GE`, `INET_DIAG_BC_S_LE`: the source (local) port at
/// least, at most, the next word's `no` field.
const BC_S_GE: u8 = 2;
const BC_S_LE: u8 = 3;
/// `TCP_LISTEN`.
const TCP_LISTEN: u32 = 10;
/// The size of a `struct nlmsghdr`.
const HEADER: usize = 16;
/// The size of a `struct inet_diag_msg` up to its inode.
const MESSAGE: usize = 72;

impl Diag {
    /// A `sock_diag` socket of the calling thread's own namespace (the
    /// server's).
    pub fn here() -> io::Result<Diag> {
        Ok(Diag {
            fd: raw_socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_SOCK_DIAG)?,
        })
    }

    /// Every TCP socket that listens on `port`, IPv4 and IPv6: the kernel
    /// filters them (a port comparison it runs itself), so only those come
    /// back, however many sockets the namespace holds.
    pub fn listening(&self, port: u16) -> io::Result<Vec<Listening>> {
        let mut found = Vec::new();
        for family in [libc::AF_INET, libc::AF_INET6] {
            self.query(family as u8, port, &mut found)?;
        }
        Ok(found)
    }

    fn query(&self, family: u8, port: u16, found: &mut Vec<Listening>) -> io::Result<()> {
        let request = request(family, port);
        // SAFETY: `request` is a whole netlink message and outlives the call.
        let sent = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buffer = vec![0u8; 16 << 10];
        loop {
            // SAFETY: `buffer` is writable for its whole length.
            let read = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    0,
                )
            };
            let Ok(read) = usize::try_from(read) else {
                return Err(io::Error::last_os_error());
            };
            if parse(&buffer[..read], found)? {
                return Ok(());
            }
        }
    }
}

/// A dump request for the TCP listeners of `family` on `port`.
fn request(family: u8, port: u16) -> Vec<u8> {
    // Bytecode: port >= P (else reject), port <= P (else reject): each op
    // is {code, yes, no: u16} followed by a word whose `no` is the port.
    let op = |code: u8, yes: u8, no: u16| {
        let mut bytes = vec![code, yes];
        bytes.extend_from_slice(&no.to_ne_bytes());
        bytes
    };
    let mut bytecode = Vec::with_capacity(16);
    bytecode.extend(op(BC_S_GE, 8, 20));
    bytecode.extend(op(0, 0, port));
    bytecode.extend(op(BC_S_LE, 8, 12));
    bytecode.extend(op(0, 0, port));
    // struct inet_diag_req_v2: family, protocol, ext, pad, states, then a
    // struct inet_diag_sockid (48 bytes) left zero.
    let mut body = Vec::with_capacity(56 + 4 + bytecode.len());
    body.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    body.extend_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    body.extend_from_slice(&[0u8; 48]);
    let attribute = (4 + bytecode.len()) as u16;
    body.extend_from_slice(&attribute.to_ne_bytes());
    body.extend_from_slice(&REQ_BYTECODE.to_ne_bytes());
    body.extend_from_slice(&bytecode);
    let length = (HEADER + body.len()) as u32;
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    let mut message = Vec::with_capacity(length as usize);
    message.extend_from_slice(&length.to_ne_bytes());
    message.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    message.extend_from_slice(&flags.to_ne_bytes());
    message.extend_from_slice(&[0u8; 8]);
    message.extend_from_slice(&body);
    message
}

/// Reads one datagram of a dump into `found`; whether the dump is over.
fn parse(mut data: &[u8], found: &mut Vec<Listening>) -> io::Result<bool> {
    let short = || io::Error::new(io::ErrorKind::InvalidData, "a short sock_diag answer");
    while data.len() >= HEADER {
        let length = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        if length < HEADER || length > data.len() {
            return Err(short());
        }
        let body = &data[HEADER..length];
        match i32::from(kind) {
            libc::NLMSG_DONE => return Ok(true),
            libc::NLMSG_ERROR => {
                let errno = body
                    .get(..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or_else(short)?;
                return Err(io::Error::from_raw_os_error(-errno));
            }
            _ if kind == SOCK_DIAG_BY_FAMILY => {
                if body.len() < MESSAGE {
                    return Err(short());
                }
                let source = &body[8..24];
                let address = match body[0] as i32 {
                    libc::AF_INET => {
                        IpAddr::V4(Ipv4Addr::new(source[0], source[1], source[2], source[3]))
                    }
                    _ => {
                        let mut octets = [0u8; 16];
                        octets.copy_from_slice(source);
                        IpAddr::V6(Ipv6Addr::from(octets))
                    }
                };
                let inode = u32::from_ne_bytes([body[68], body[69], body[70], body[71]]);
                found.push(Listening { address, inode });
            }
            _ => {}
        }
        // Messages are aligned to 4 bytes.
        let next = (length + 3) & !3;
        data = data.get(next..).unwrap_or_default();
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_names_the_listeners_of_one_port_and_no_other() {
        let diag = Diag::here().expect("a sock_diag socket");
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
        let port = listener.local_addr().expect("address").port();
        let other = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
        let found = diag.listening(port).expect("asked");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].address, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(found[0].reached_from_loopback());
        // Its inode is the socket's own.
        let link = std::fs::read_link(format!("/proc/self/fd/{}", listener.as_raw_fd()))
            .expect("the socket's link");
        assert_eq!(
            link.to_string_lossy(),
            format!("socket:[{}]", found[0].inode)
        );
        drop(listener);
        assert_eq!(diag.listening(port).expect("asked"), Vec::new());
        drop(other);
    }

    #[test]
    fn only_loopback_and_wildcard_listeners_are_reached_from_loopback() {
        let at = |address: &str| Listening {
            address: address.parse().expect("an address"),
            inode: 1,
        };
        for reached in ["127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"] {
            assert!(at(reached).reached_from_loopback(), "{reached}");
        }
        for not in ["127.0.0.2", "10.0.0.1", "::1", "::ffff:10.0.0.1"] {
            assert!(!at(not).reached_from_loopback(), "{not}");
        }
    }

    #[tokio::test]
    async fn a_new_namespace_has_its_own_loopback_and_nothing_of_the_hosts() {
        if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
            return;
        }
        let host = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
        let port = host.local_addr().expect("address").port();
        let netns = Netns::create().await.expect("a namespace");
        // The host's listener is not there.
        let refused = netns
            .connect(port)
            .await
            .expect_err("nothing listens there");
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        let diag = netns.diag().await.expect("its diagnostics");
        assert_eq!(diag.listening(port).expect("asked"), Vec::new());
        // A listener made in it is reached through it, and named by it.
        let socket = netns.socket().await.expect("a socket there");
        socket
            .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .expect("the port is free there");
        let inside = socket.listen(4).expect("listens");
        let (connected, accepted) = tokio::join!(netns.connect(port), inside.accept());
        connected.expect("connects inside");
        accepted.expect("accepted inside");
        let found = diag.listening(port).expect("asked");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            Diag::here()
                .expect("host")
                .listening(port)
                .expect("asked")
                .len()
                == 1
        );
    }

    #[tokio::test]
    async fn the_proxys_dial_lands_in_the_namespace_never_on_the_hosts_loopback() {
        use runloop_proxy::Dial;
        if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
            return;
        }
        // The same port on the host's loopback and in the run's.
        let host = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
        host.set_nonblocking(true).expect("non-blocking");
        let port = host.local_addr().expect("address").port();
        let netns = Netns::create().await.expect("a namespace");
        let dialer = netns.dialer(port);
        assert_eq!(
            dialer.to_string(),
            format!("127.0.0.1:{port} in the run's network namespace")
        );
        assert_eq!(
            dialer.address(),
            SocketAddr::from((Ipv4Addr::LOCALHOST, port))
        );
        // Nothing listens in the namespace yet: refused, not the host's.
        let refused = dialer.connect().await.expect_err("nothing listens there");
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        let socket = netns.socket().await.expect("a socket there");
        socket
            .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .expect("the port is free there");
        let inside = socket.listen(4).expect("listens");
        let (dialed, accepted) = tokio::join!(dialer.connect(), inside.accept());
        let dialed = dialed.expect("dials inside");
        let (_, from) = accepted.expect("accepted inside");
        assert_eq!(dialed.local_addr().expect("its address"), from);
        // The host's listener heard nothing (a connection made to it
        // would be queued by now: a dial returns once it is made).
        let heard = host.accept().map(|_| ());
        assert_eq!(
            heard.map_err(|error| error.kind()),
            Err(io::ErrorKind::WouldBlock),
            "the host's listener was reached"
        );
    }

    #[tokio::test]
    async fn a_bound_namespace_is_found_by_its_path_and_removed_with_it() {
        if !runloop_testkit::needs(&[runloop_testkit::Part::Root]) {
            return;
        }
        let dir = std::env::temp_dir().join(format!("runloop-netns-{}", std::process::id()));
        let path = dir.join("bound");
        let netns = Netns::create_at(&path).await.expect("made and bound");
        // The path names the same namespace as the descriptor.
        let inode = |path: &Path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(path).expect("there").ino()
        };
        let by_fd = format!("/proc/self/fd/{}", netns.fd().as_raw_fd());
        assert_eq!(inode(&path), inode(Path::new(&by_fd)));
        remove_at(&path).expect("removed");
        assert!(!path.exists());
        remove_at(&path).expect("absent is fine");
        let _ = std::fs::remove_dir(&dir);
    }
}
