use std::fmt;
use std::str::FromStr;

/// An Ethernet unicast address, as used for VTEP devices and FDB entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MacError {
    #[error("expected six two-digit hex octets separated by ':'")]
    Format,
    #[error("multicast addresses cannot be VTEP addresses")]
    Multicast,
    #[error("the all-zero address cannot be a VTEP address")]
    Zero,
}

impl MacAddr {
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
}

impl FromStr for MacAddr {
    type Err = MacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut octets = [0u8; 6];
        let mut parts = s.split(':');
        for octet in octets.iter_mut() {
            let part = parts.next().ok_or(MacError::Format)?;
            // from_str_radix alone would take "+6" or "6".
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(MacError::Format);
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| MacError::Format)?;
        }
        if parts.next().is_some() {
            return Err(MacError::Format);
        }
        if octets[0] & 1 == 1 {
            return Err(MacError::Multicast);
        }
        if octets == [0; 6] {
            return Err(MacError::Zero);
        }
        Ok(MacAddr(octets))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_lowercase() {
        let mac: MacAddr = "66:AA:00:0b:00:01".parse().unwrap();
        assert_eq!(mac.to_string(), "66:aa:00:0b:00:01");
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "66:aa:00:00:00",
            "66:aa:00:00:00:01:02",
            "66:aa:00:00:00:zz",
            "66aa00000001",
            "66:aa:00:00:00:001",
            "66::00:00:00:01",
            "+6:aa:00:00:00:01",
            "6:aa:00:00:00:01",
            "66:aa:00:00:00:-1",
            "66:aa:00:00:00:1",
        ] {
            assert_eq!(bad.parse::<MacAddr>(), Err(MacError::Format), "{bad:?}");
        }
        assert_eq!(
            "01:00:5e:00:00:01".parse::<MacAddr>(),
            Err(MacError::Multicast)
        );
        assert_eq!("00:00:00:00:00:00".parse::<MacAddr>(), Err(MacError::Zero));
    }
}
