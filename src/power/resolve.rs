//! Name resolution for every power driver, without glibc: the image is a static binary on
//! scratch, where glibc's `getaddrinfo` has no NSS modules to load. hickory reads the nameservers
//! from resolv.conf (kubelet mounts the pod's own at /etc/resolv.conf) and asks them itself.
//! IP literals never touch DNS.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use hickory_resolver::TokioResolver;
use hickory_resolver::name_server::TokioConnectionProvider;

/// Overrides the resolv.conf the drivers read (tests point it at a loopback nameserver).
pub const RESOLV_CONF_ENV: &str = "HOMELAB_RESOLV_CONF";
const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(
        "cannot resolve {host}: reading the nameservers from {path}: {detail} \
         (set {RESOLV_CONF_ENV} to another resolv.conf, or use an IP address)"
    )]
    Config { host: String, path: String, detail: String },
    #[error(
        "cannot resolve {host} with the nameservers in {path}: {detail} (check the name, or use \
         an IP address)"
    )]
    Lookup { host: String, path: String, detail: String },
}

/// The resolv.conf in use.
fn conf_path() -> PathBuf {
    std::env::var_os(RESOLV_CONF_ENV).map_or_else(|| DEFAULT_RESOLV_CONF.into(), PathBuf::from)
}

/// `host` as an IP address, if it is one (`[::1]` as in a URL too).
fn literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

/// A resolver built from resolv.conf on first use: the drivers that never meet a name never
/// read it. Build one per power action: hickory's connections belong to the tokio runtime that
/// made them.
#[derive(Clone, Default)]
pub struct Resolver {
    inner: Arc<tokio::sync::OnceCell<TokioResolver>>,
}

impl Resolver {
    pub fn new() -> Self {
        Self::default()
    }

    async fn hickory(&self, host: &str) -> Result<&TokioResolver, ResolveError> {
        self.inner
            .get_or_try_init(|| async {
                let path = conf_path();
                let error = |detail: String| ResolveError::Config {
                    host: host.into(),
                    path: path.display().to_string(),
                    detail,
                };
                let text = tokio::fs::read(&path).await.map_err(|e| error(e.to_string()))?;
                let (config, options) = hickory_resolver::system_conf::parse_resolv_conf(text)
                    .map_err(|e| error(e.to_string()))?;
                if config.name_servers().is_empty() {
                    return Err(error("it lists no nameserver".into()));
                }
                Ok(TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
                    .with_options(options)
                    .build())
            })
            .await
    }

    /// The addresses of `host` (a name or an IP literal) with `port`.
    pub async fn lookup(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ResolveError> {
        if let Some(ip) = literal(host) {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let resolver = self.hickory(host).await?;
        let lookup_error = |detail: String| ResolveError::Lookup {
            host: host.into(),
            path: conf_path().display().to_string(),
            detail,
        };
        let found = resolver.lookup_ip(host).await.map_err(|e| lookup_error(e.to_string()))?;
        let addrs: Vec<SocketAddr> = found.iter().map(|ip| SocketAddr::new(ip, port)).collect();
        if addrs.is_empty() {
            return Err(lookup_error("no address".into()));
        }
        tracing::debug!(host, ?addrs, "resolved");
        Ok(addrs)
    }
}

/// The same resolver for reqwest (Redfish, HTTP plugs): reqwest fills in the URL's port.
impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let resolver = self.clone();
        Box::pin(async move {
            let addrs = resolver.lookup(name.as_str(), 0).await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_are_not_names() {
        assert_eq!(literal("10.0.0.5"), Some(IpAddr::from([10, 0, 0, 5])));
        assert_eq!(literal("[::1]"), Some(IpAddr::from(std::net::Ipv6Addr::LOCALHOST)));
        assert_eq!(literal("::1"), Some(IpAddr::from(std::net::Ipv6Addr::LOCALHOST)));
        assert_eq!(literal("bmc.lan"), None);
    }

    #[tokio::test]
    async fn a_literal_needs_no_resolv_conf() {
        // No nameserver, no file read: a literal comes back as is.
        let addrs = Resolver::new().lookup("192.168.1.20", 22).await.expect("literal");
        assert_eq!(addrs, vec![SocketAddr::from(([192, 168, 1, 20], 22))]);
    }
}
