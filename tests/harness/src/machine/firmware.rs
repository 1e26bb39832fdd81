//! A real machine's power state, the one thing that starts and stops its software: `Off` or
//! `On` (running [`Os`]). Every transition goes through [`Firmware`], behind the machine's lock,
//! so a power button, a Wake-on-LAN packet or a BMC call (later) can each press it from its own
//! task: pressing "on" on a machine that is on does nothing, as on the real thing.

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result};

use super::Board;
use super::os::Os;
use crate::progress;

/// Whether the machine has power.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerState {
    Off,
    On,
}

/// How long a graceful shutdown waits for each step before it cuts the power.
const SHUTDOWN_STEP_SECONDS: &str = "10";

#[derive(Default)]
pub(crate) struct Firmware {
    os: Option<Os>,
}

impl Firmware {
    pub fn state(&self) -> PowerState {
        if self.os.is_some() { PowerState::On } else { PowerState::Off }
    }

    pub fn os(&self) -> Option<&Os> {
        self.os.as_ref()
    }

    /// Off → On: boots containerd and the kubelet. On: nothing.
    pub async fn power_on(&mut self, board: &Board) -> Result<()> {
        if self.os.is_some() {
            return Ok(());
        }
        let boot = board.boots.fetch_add(1, Ordering::SeqCst) + 1;
        match Os::boot(board, boot).await {
            Ok(os) => {
                self.os = Some(os);
                Ok(())
            }
            Err(err) => {
                // A failed boot leaves nothing running: the machine is Off.
                board.run("cut", &[board.cgroups.root()]).await?;
                Err(err.context(format!("booting machine {}", board.name)))
            }
        }
    }

    /// On → Off at once, as when the plug is pulled: every process of the machine (kubelet,
    /// containerd, shims, containers) is SIGKILLed. Off: nothing.
    pub async fn power_cut(&mut self, board: &Board) -> Result<()> {
        let Some(os) = self.os.take() else { return Ok(()) };
        let started = Instant::now();
        board.run("cut", &[board.cgroups.root()]).await.context("cutting the power")?;
        // Its processes are dead; the wrappers are reaped.
        drop(os);
        progress(&format!("machine {} power cut in {:.1?}", board.name, started.elapsed()));
        Ok(())
    }

    /// On → Off in order, as an OS shutdown does: the kubelet stops (SIGTERM), then every
    /// other process gets SIGTERM (containers first get the chance to exit cleanly), and what
    /// is left after a while is SIGKILLed. Off: nothing.
    pub async fn shutdown(&mut self, board: &Board) -> Result<()> {
        let Some(os) = self.os.take() else { return Ok(()) };
        let started = Instant::now();
        let kubelet = board.cgroups.group("kubelet");
        let root = board.cgroups.root();
        board.run("signal", &["TERM", &kubelet]).await?;
        // A status 1 (something still running) is what the final cut is for.
        let _ = board.run("wait-empty", &[SHUTDOWN_STEP_SECONDS, &kubelet]).await;
        board.run("signal", &["TERM", root]).await?;
        let _ = board.run("wait-empty", &[SHUTDOWN_STEP_SECONDS, root]).await;
        board.run("cut", &[root]).await.context("powering off after the shutdown")?;
        drop(os);
        progress(&format!("machine {} shut down in {:.1?}", board.name, started.elapsed()));
        Ok(())
    }
}
