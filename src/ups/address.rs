//! A UPS's address as NUT's tools write it: `<ups>@<host>[:<port>]`.

use std::fmt;

/// The port upsd listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 3493;

/// Where a UPS is served.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UpsAddress {
    pub ups: String,
    pub host: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a UPS address: {reason}; write it as NUT does, <ups>@<host>[:<port>], for example ups@nut.home.lan:3493"
)]
pub struct AddressError {
    pub text: String,
    pub reason: &'static str,
}

impl std::str::FromStr for UpsAddress {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |reason| AddressError { text: text.to_owned(), reason };
        let (ups, server) =
            text.split_once('@').ok_or_else(|| fail("no @ between the UPS and its host"))?;
        if ups.is_empty() {
            return Err(fail("the UPS name before @ is empty"));
        }
        if !ups.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
            return Err(fail("a UPS name has only letters, digits, '_', '.' and '-'"));
        }
        let (host, port) = match server.rsplit_once(':') {
            Some((host, port)) => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| fail("the port is not a number from 1 to 65535"))?;
                if port == 0 {
                    return Err(fail("the port is not a number from 1 to 65535"));
                }
                (host, port)
            }
            None => (server, DEFAULT_PORT),
        };
        if host.is_empty() || host.contains(char::is_whitespace) || host.contains('@') {
            return Err(fail("the host after @ is empty or has spaces"));
        }
        Ok(UpsAddress { ups: ups.to_owned(), host: host.to_owned(), port })
    }
}

impl fmt::Display for UpsAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}:{}", self.ups, self.host, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The UPS, host and port an address reads as, or a fragment of its refusal.
    type Expected = Result<(&'static str, &'static str, u16), &'static str>;

    #[test]
    fn addresses_read_as_upsc_reads_them() {
        let cases: &[(&str, Expected)] = &[
            ("ups@nut.home.lan", Ok(("ups", "nut.home.lan", 3493))),
            ("eaton-5e@192.168.1.4:3494", Ok(("eaton-5e", "192.168.1.4", 3494))),
            ("dummy@127.0.0.1:40000", Ok(("dummy", "127.0.0.1", 40000))),
            ("nut.home.lan", Err("no @")),
            ("@host", Err("empty")),
            ("ups@", Err("empty")),
            ("ups@host:0", Err("port")),
            ("ups@host:99999", Err("port")),
            ("ups@host:x", Err("port")),
            ("u ps@host", Err("letters")),
            ("ups@ho st", Err("spaces")),
        ];
        for (text, expected) in cases {
            let parsed = text.parse::<UpsAddress>();
            match (parsed, expected) {
                (Ok(a), Ok((ups, host, port))) => {
                    assert_eq!(
                        (a.ups.as_str(), a.host.as_str(), a.port),
                        (*ups, *host, *port),
                        "{text}"
                    );
                }
                (Err(e), Err(fragment)) => {
                    let message = e.to_string();
                    assert!(message.contains(fragment), "{text}: {message}");
                    assert!(message.contains("<ups>@<host>[:<port>]"), "{text}: {message}");
                }
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
    }
}
