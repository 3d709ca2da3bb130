//! Client networks: which addresses may talk to a store at all.

use std::fmt;
use std::net::IpAddr;

use machine_core::{Error, Result};

/// An IP network (`10.0.0.0/24`, `fd00::/64`) or one address (`10.0.0.7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// The network of `addr` with `prefix` bits; an invalid-spec error on `network` when
    /// the prefix is longer than the address.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(Error::invalid_spec(
                "network",
                format!("prefix /{prefix} is longer than {max} bits"),
            ));
        }
        Ok(Network { addr, prefix })
    }

    /// One address.
    pub fn host(addr: IpAddr) -> Self {
        Network {
            addr,
            prefix: if addr.is_ipv4() { 32 } else { 128 },
        }
    }

    /// Reads `a.b.c.d/n`, `x::y/n` or a bare address; an invalid-spec error on `network`
    /// otherwise.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            Error::invalid_spec(
                "network",
                format!(
                    "{} is not an address or a network (10.0.0.0/24)",
                    machine_core::shown(text)
                ),
            )
        };
        match text.split_once('/') {
            None => Ok(Network::host(text.parse().map_err(|_| bad())?)),
            Some((addr, prefix)) => Network::new(
                addr.parse().map_err(|_| bad())?,
                prefix.parse().map_err(|_| bad())?,
            ),
        }
    }

    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_contain_what_they_should() {
        let n = Network::parse("10.1.2.0/24").unwrap();
        assert!(n.contains("10.1.2.200".parse().unwrap()));
        assert!(!n.contains("10.1.3.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.2.3".parse().unwrap()));
        let any = Network::parse("0.0.0.0/0").unwrap();
        assert!(any.contains("192.0.2.1".parse().unwrap()));
        assert!(!any.contains("::1".parse().unwrap()));
        let one = Network::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let v6 = Network::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(Network::parse("10.0.0.0/33").is_err());
        assert!(Network::parse("nonsense").is_err());
    }
}
