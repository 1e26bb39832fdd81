//! A clean shutdown over SSH (`russh`): log in with a key from a Secret, check the machine's
//! host key against the one the slot pins, run the command. A machine that powers off may drop
//! the connection before it reports an exit status; that counts as done.

use std::sync::Arc;
use std::time::Duration;

use russh::ChannelMsg;
use russh::client;
use russh::keys::{PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};

use super::resolve::Resolver;
use super::{PowerError, Secrets, with_causes};
use crate::api::{DEFAULT_SSH_COMMAND, SshShutdown};

const DEFAULT_PORT: u16 = 22;
const TIMEOUT: Duration = Duration::from_secs(30);

/// Parses a pinned host key: `ssh-ed25519 AAAA...`, with or without a leading host part and a
/// trailing comment (a known_hosts line or `ssh-keyscan` output both work).
pub fn parse_host_key(text: &str) -> Result<PublicKey, PowerError> {
    let tokens: Vec<&str> = text.split_whitespace().collect();
    let at = tokens
        .iter()
        .position(|t| t.starts_with("ssh-") || t.starts_with("ecdsa-") || t.starts_with("sk-"));
    let key = at
        .and_then(|at| tokens.get(at..at + 2))
        .map(|pair| pair.join(" "))
        .and_then(|line| PublicKey::from_openssh(&line).ok());
    key.ok_or_else(|| {
        PowerError::Settings(format!(
            "ssh.knownHostKey {text:?} is not a host key such as `ssh-ed25519 AAAAC3...` \
             (see `ssh-keyscan <host>`)"
        ))
    })
}

struct PinnedHost {
    expected: PublicKey,
    /// The key the server offered, when it was not the pinned one.
    offered: Arc<std::sync::Mutex<Option<String>>>,
}

impl client::Handler for PinnedHost {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::PublicKey { key, .. } = server_key else {
            return Ok(false);
        };
        if key.key_data() == self.expected.key_data() {
            return Ok(true);
        }
        if let Ok(mut offered) = self.offered.lock() {
            *offered = Some(key.to_openssh().unwrap_or_else(|_| key.algorithm().to_string()));
        }
        Ok(false)
    }
}

/// Runs the shutdown command.
#[tracing::instrument(skip_all, fields(host = %settings.host))]
pub async fn shutdown(settings: &SshShutdown, secrets: &Secrets) -> Result<String, PowerError> {
    let port = settings.port.unwrap_or(DEFAULT_PORT);
    let peer = format!("SSH at {}:{port}", settings.host);
    let expected = parse_host_key(&settings.known_host_key)?;
    let pem = secrets.text(&settings.private_key)?;
    let key = russh::keys::decode_secret_key(&pem, None).map_err(|e| PowerError::ReadSecret {
        secret: settings.private_key.name.clone(),
        detail: format!(
            "key {:?} is not an unencrypted OpenSSH private key: {e}",
            settings.private_key.key
        ),
    })?;
    let command = settings.command.as_deref().unwrap_or(DEFAULT_SSH_COMMAND);
    let offered = Arc::new(std::sync::Mutex::new(None));
    let handler = PinnedHost { expected, offered: offered.clone() };
    let config =
        Arc::new(client::Config { inactivity_timeout: Some(TIMEOUT), ..client::Config::default() });
    let addrs = Resolver::new()
        .lookup(&settings.host, port)
        .await
        .map_err(|e| PowerError::protocol(&peer, e))?;
    let connect = client::connect(config, &addrs[..], handler);
    let mut session = match tokio::time::timeout(TIMEOUT, connect).await {
        Err(_) => return Err(PowerError::protocol(&peer, "no SSH handshake within 30s")),
        Ok(Ok(session)) => session,
        Ok(Err(error)) => {
            let offered = offered.lock().ok().and_then(|o| o.clone());
            return Err(match offered {
                Some(key) => PowerError::protocol(
                    &peer,
                    format!(
                        "the host key is {key}, not the one in ssh.knownHostKey: refusing to log \
                         in (if the machine was reinstalled, pin its new key)"
                    ),
                ),
                None => PowerError::protocol(&peer, with_causes(&error)),
            });
        }
    };
    let hash = session
        .best_supported_rsa_hash()
        .await
        .map_err(|e| PowerError::protocol(&peer, e))?
        .flatten();
    let auth = session
        .authenticate_publickey(&settings.user, PrivateKeyWithHashAlg::new(Arc::new(key), hash))
        .await
        .map_err(|e| PowerError::protocol(&peer, e))?;
    if !auth.success() {
        return Err(PowerError::Unauthorized {
            peer,
            secret: settings.private_key.name.clone(),
            detail: format!("user {:?} and this key were not accepted", settings.user),
        });
    }
    let mut channel =
        session.channel_open_session().await.map_err(|e| PowerError::protocol(&peer, e))?;
    channel.exec(true, command).await.map_err(|e| PowerError::protocol(&peer, e))?;
    let mut stderr = Vec::new();
    let mut exit = None;
    while let Some(message) = channel.wait().await {
        match message {
            ChannelMsg::ExtendedData { data, .. } => stderr.extend_from_slice(&data),
            ChannelMsg::ExitStatus { exit_status } => exit = Some(exit_status),
            _ => {}
        }
    }
    let _ = session.disconnect(russh::Disconnect::ByApplication, "", "en").await;
    match exit {
        Some(0) => Ok(format!("{peer} ran {command:?}")),
        None => Ok(format!("{peer} ran {command:?}; the connection closed without an exit status")),
        Some(code) => Err(PowerError::protocol(
            &peer,
            format!("{command:?} exited {code}: {}", String::from_utf8_lossy(&stderr).trim()),
        )),
    }
}
