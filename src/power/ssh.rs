//! A clean shutdown over SSH (`russh`): log in with a key from a Secret, check the machine's
//! host key against the one the slot pins, run the command. Exit status 0 is done. A session
//! that closes without an exit status is only "sent": a machine powering off may drop the
//! connection first, but so does a link that stalls right after `exec`, when the machine never
//! got the command. So a sent shutdown counts as done only once the host stops answering on its
//! SSH port and stays silent for [`QUIET_AFTER_SENT`] (longer than a link blip); a host that
//! answers (a connection accepted, or refused by its kernel) is up. A suspend is confirmed the
//! same way: the host must fall silent after the command, which exits 0 before the machine
//! sleeps.

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
/// How long a host must stay silent after a sent shutdown for it to count as off.
pub const QUIET_AFTER_SENT: Duration = Duration::from_secs(60);
/// How long one probe of the SSH port waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the SSH port is probed while watching a sent shutdown.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

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

/// Runs the shutdown command. `confirm`: how long after a session that closed without an exit
/// status the host may take to fall silent.
#[tracing::instrument(skip_all, fields(host = %settings.host))]
pub async fn shutdown(
    settings: &SshShutdown,
    secrets: &Secrets,
    confirm: Duration,
) -> Result<String, PowerError> {
    let command = settings.command.as_deref().unwrap_or(DEFAULT_SSH_COMMAND);
    let ran = run(settings, secrets, command).await?;
    let Ran { peer, port, addrs, exit, stderr } = ran;
    match exit {
        Some(0) => Ok(format!("{peer} ran {command:?}")),
        None => {
            tracing::info!("the session closed without an exit status: watching the host");
            let sent =
                format!("{command:?} was sent and the connection closed without an exit status");
            match watch_silence(&addrs, confirm, QUIET_AFTER_SENT).await {
                Ok(quiet) => Ok(format!(
                    "{peer}: {sent}; the host has not answered on port {port} for {}s since",
                    quiet.as_secs()
                )),
                Err(answered) => Err(PowerError::NotConfirmed {
                    peer,
                    wanted: super::PowerState::Off,
                    waited: confirm,
                    last: format!(
                        "{sent}, and the host still answers on port {port} ({answered}): the \
                         machine may never have got the command"
                    ),
                }),
            }
        }
        Some(code) => Err(exited(&peer, command, code, &stderr)),
    }
}

/// Runs the suspend command, then confirms the suspend took: the host must stop answering on
/// its SSH port and stay silent for `quiet`, beginning within `confirm`. A host that still
/// answers did not suspend (no S3 in its firmware, an inhibitor lock): that is an error, never
/// a machine taken for asleep.
#[tracing::instrument(skip_all, fields(host = %settings.host))]
pub async fn suspend(
    settings: &SshShutdown,
    command: &str,
    secrets: &Secrets,
    quiet: Duration,
    confirm: Duration,
) -> Result<String, PowerError> {
    let Ran { peer, port, addrs, exit, stderr } = run(settings, secrets, command).await?;
    if let Some(code) = exit.filter(|code| *code != 0) {
        return Err(exited(&peer, command, code, &stderr));
    }
    match watch_silence(&addrs, confirm, quiet).await {
        Ok(quiet) => Ok(format!(
            "{peer} ran {command:?}; the host has not answered on port {port} for {}s since",
            quiet.as_secs()
        )),
        Err(answered) => Err(PowerError::NotSuspended {
            peer,
            command: command.to_owned(),
            waited: confirm,
            answered: answered.to_owned(),
        }),
    }
}

/// A command that exited non-zero, with what it said.
fn exited(peer: &str, command: &str, code: u32, stderr: &[u8]) -> PowerError {
    PowerError::protocol(
        peer,
        format!("{command:?} exited {code}: {}", String::from_utf8_lossy(stderr).trim()),
    )
}

/// What one command over SSH did.
struct Ran {
    peer: String,
    port: u16,
    addrs: Vec<std::net::SocketAddr>,
    /// Its exit status; none when the session closed without one.
    exit: Option<u32>,
    stderr: Vec<u8>,
}

/// Logs in (the host key pinned, the key from its Secret) and runs `command`.
async fn run(settings: &SshShutdown, secrets: &Secrets, command: &str) -> Result<Ran, PowerError> {
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
    Ok(Ran { peer, port, addrs, exit, stderr })
}

/// Probes the host's SSH port until it accepts a connection (`true`), or `within` has passed
/// (`false`): a machine woken from sleep answers once its network is back.
pub async fn answers_within(settings: &SshShutdown, within: Duration) -> Result<bool, PowerError> {
    let port = settings.port.unwrap_or(DEFAULT_PORT);
    let addrs = Resolver::new()
        .lookup(&settings.host, port)
        .await
        .map_err(|e| PowerError::protocol(format!("SSH at {}:{port}", settings.host), e))?;
    let started = tokio::time::Instant::now();
    loop {
        if probe(&addrs).await == Some(ACCEPTED) {
            return Ok(true);
        }
        if started.elapsed() >= within {
            return Ok(false);
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// What [`probe`] says of a port that accepted a connection.
const ACCEPTED: &str = "a connection was accepted";

/// Whether the host answered one probe of its SSH port, and how.
async fn probe(addrs: &[std::net::SocketAddr]) -> Option<&'static str> {
    for addr in addrs {
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => return Some(ACCEPTED),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Some("a connection was refused");
            }
            // A timeout, or no route: nothing answered.
            Ok(Err(_)) | Err(_) => {}
        }
    }
    None
}

/// Watches a host after a sent shutdown or a suspend: `Ok(quiet)` once it has been silent for
/// `quiet`, or `Err(how it answered)` when no silence began within `confirm`.
async fn watch_silence(
    addrs: &[std::net::SocketAddr],
    confirm: Duration,
    quiet: Duration,
) -> Result<Duration, &'static str> {
    let started = tokio::time::Instant::now();
    let mut watch = QuietWatch::default();
    loop {
        let answer = probe(addrs).await;
        match watch.observe(answer, started.elapsed(), confirm, quiet) {
            Verdict::Watching => {}
            Verdict::Quiet(quiet) => return Ok(quiet),
            Verdict::Answers(how) => return Err(how),
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// What a run of probes says about a host that was sent a shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Watching,
    /// Silent for this long: off.
    Quiet(Duration),
    /// It answered, and no silence began in time (the last answer).
    Answers(&'static str),
}

/// The probes seen so far: when the current silence began. Pure.
#[derive(Debug, Default)]
struct QuietWatch {
    silent_since: Option<Duration>,
    last_answer: Option<&'static str>,
}

impl QuietWatch {
    /// One probe's answer (`None`: silence) at `elapsed` since the session closed. A silence
    /// must begin within `confirm` and last `quiet`; an answer ends it.
    fn observe(
        &mut self,
        answer: Option<&'static str>,
        elapsed: Duration,
        confirm: Duration,
        quiet: Duration,
    ) -> Verdict {
        match answer {
            Some(how) => {
                self.silent_since = None;
                self.last_answer = Some(how);
            }
            None => {
                let since = *self.silent_since.get_or_insert(elapsed);
                if elapsed.saturating_sub(since) >= quiet {
                    return Verdict::Quiet(elapsed - since);
                }
            }
        }
        match (self.silent_since, self.last_answer) {
            (None, Some(how)) if elapsed >= confirm => Verdict::Answers(how),
            _ => Verdict::Watching,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACCEPTED: Option<&str> = Some("a connection was accepted");

    /// Probes one second apart; the verdict after the last.
    fn verdict(answers: &[Option<&'static str>], confirm: u64, quiet: u64) -> Verdict {
        let mut watch = QuietWatch::default();
        let mut last = Verdict::Watching;
        for (second, answer) in answers.iter().enumerate() {
            let elapsed = Duration::from_secs(second as u64);
            last = watch.observe(
                *answer,
                elapsed,
                Duration::from_secs(confirm),
                Duration::from_secs(quiet),
            );
            if last != Verdict::Watching {
                break;
            }
        }
        last
    }

    #[test]
    fn quiet_watch_table() {
        let silent = |n: usize| vec![None; n];
        let answering = |n: usize| vec![ACCEPTED; n];
        let then = |a: Vec<Option<&'static str>>, b: Vec<Option<&'static str>>| [a, b].concat();
        let table = [
            (
                "silent from the start, for the quiet",
                silent(6),
                Verdict::Quiet(Duration::from_secs(5)),
            ),
            ("silent, not long enough yet", silent(5), Verdict::Watching),
            (
                "answering past the confirm timeout",
                answering(4),
                Verdict::Answers("a connection was accepted"),
            ),
            (
                "answering a while (sshd stopping), then silent",
                then(answering(2), silent(6)),
                Verdict::Quiet(Duration::from_secs(5)),
            ),
            (
                "a blip: silent, then answering again past the confirm timeout",
                then(silent(3), answering(2)),
                Verdict::Answers("a connection was accepted"),
            ),
            (
                "a silence that began in time is seen through",
                then(answering(3), silent(6)),
                Verdict::Quiet(Duration::from_secs(5)),
            ),
            (
                "refused is an answer: the kernel is up",
                vec![Some("a connection was refused"); 4],
                Verdict::Answers("a connection was refused"),
            ),
        ];
        for (name, answers, want) in table {
            assert_eq!(verdict(&answers, 3, 5), want, "{name}");
        }
    }
}
