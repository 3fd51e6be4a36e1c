//! The kernel's connection tracking, asked to forget one run's address
//! when its egress link goes ([`forget`]).
//!
//! Why: a run's connections out are NAT'd, and the kernel keeps each one's
//! entry (an established TCP one for days) after the run is gone. Once
//! another run is given the same /30 — by this server after it has gone
//! through its network, or by another server — the replies still coming
//! for the old entries would be let in to the new run as its own. Deleting
//! every entry whose source is the run's address, right after its link is
//! deleted (and only then: the address was the run's until that moment),
//! leaves nothing for a later holder of the address to receive.
//!
//! One ctnetlink message (`IPCTNL_MSG_CT_DELETE` with a filter on the
//! original source address: a flush of the matching entries), made here
//! rather than by running `conntrack`, which Debian does not install with
//! nftables.

use std::io;
use std::net::Ipv4Addr;

use rustix::net::{
    AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, netlink, recv, send, socket_with,
};

/// `NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE`.
const DELETE: u16 = (1 << 8) | 2;
/// `NLM_F_REQUEST | NLM_F_ACK`.
const REQUEST_ACK: u16 = 0x1 | 0x4;
/// `NLMSG_ERROR`: the kernel's answer (an error of 0 is success).
const NLMSG_ERROR: u16 = 2;
/// `NLA_F_NESTED`.
const NESTED: u16 = 0x8000;
/// `CTA_TUPLE_ORIG`, `CTA_FILTER`.
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_FILTER: u16 = 25;
/// `CTA_TUPLE_IP`, `CTA_IP_V4_SRC`.
const CTA_TUPLE_IP: u16 = 1;
const CTA_IP_V4_SRC: u16 = 1;
/// `CTA_FILTER_ORIG_FLAGS`, and its flag for the source address.
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_F_CTA_IP_SRC: u32 = 1;

/// One netlink attribute: its header, `payload`, padding to 4 bytes.
fn attribute(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut bytes = Vec::with_capacity(len.next_multiple_of(4));
    bytes.extend_from_slice(&(len as u16).to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(payload);
    bytes.resize(len.next_multiple_of(4), 0);
    bytes
}

/// The request: delete every IPv4 entry whose original source is `source`.
fn request(source: Ipv4Addr, sequence: u32) -> Vec<u8> {
    let tuple = attribute(
        CTA_TUPLE_ORIG | NESTED,
        &attribute(
            CTA_TUPLE_IP | NESTED,
            &attribute(CTA_IP_V4_SRC, &source.octets()),
        ),
    );
    let filter = attribute(
        CTA_FILTER | NESTED,
        &attribute(
            CTA_FILTER_ORIG_FLAGS,
            &CTA_FILTER_F_CTA_IP_SRC.to_ne_bytes(),
        ),
    );
    // nfgenmsg: the family, version 0, resource id 0.
    let family = AddressFamily::INET.as_raw() as u8;
    let body = [&[family, 0, 0, 0][..], tuple.as_slice(), filter.as_slice()].concat();
    let mut message = Vec::with_capacity(16 + body.len());
    message.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    message.extend_from_slice(&DELETE.to_ne_bytes());
    message.extend_from_slice(&REQUEST_ACK.to_ne_bytes());
    message.extend_from_slice(&sequence.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes());
    message.extend_from_slice(&body);
    message
}

/// The kernel's answer to [`request`]: `Ok` for success, else its error.
fn answer(bytes: &[u8]) -> io::Result<()> {
    let field = |at: usize| -> io::Result<[u8; 4]> {
        bytes
            .get(at..at + 4)
            .and_then(|field| field.try_into().ok())
            .ok_or_else(|| io::Error::other("a short answer from ctnetlink"))
    };
    let [kind_low, kind_high, _, _] = field(4)?;
    if u16::from_ne_bytes([kind_low, kind_high]) != NLMSG_ERROR {
        return Err(io::Error::other(
            "an answer from ctnetlink that is not an ack",
        ));
    }
    match i32::from_ne_bytes(field(16)?) {
        0 => Ok(()),
        code => Err(io::Error::from_raw_os_error(code.saturating_neg())),
    }
}

/// Deletes every connection-tracking entry whose original source is
/// `address` (blocking: a few system calls).
pub fn forget(address: Ipv4Addr) -> io::Result<()> {
    let socket = socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::NETFILTER),
    )?;
    send(&socket, &request(address, 1), SendFlags::empty())?;
    let mut buffer = [0u8; 1024];
    let (read, _) = recv(&socket, &mut buffer, RecvFlags::empty())?;
    answer(&buffer[..read])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_a_filtered_ctnetlink_delete() {
        let message = request(Ipv4Addr::new(10, 213, 0, 6), 7);
        assert_eq!(message.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(message[0..4].try_into().expect("len")) as usize,
            message.len()
        );
        assert_eq!(u16::from_ne_bytes([message[4], message[5]]), 0x0102);
        assert_eq!(
            u32::from_ne_bytes(message[8..12].try_into().expect("seq")),
            7
        );
        // The address, in network order, inside the nested tuple.
        assert!(message.windows(4).any(|w| w == [10, 213, 0, 6]));
    }

    #[test]
    fn an_answer_of_zero_is_success_and_any_other_is_the_error() {
        let mut ack = vec![0u8; 36];
        ack[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        assert!(answer(&ack).is_ok());
        ack[16..20].copy_from_slice(&(-1i32).to_ne_bytes());
        assert_eq!(answer(&ack).expect_err("EPERM").raw_os_error(), Some(1));
        assert!(answer(&[0u8; 3]).is_err());
    }
}
