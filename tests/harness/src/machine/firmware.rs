//! A real machine's power state, the one thing that starts and stops its software: `Off` or
//! `On` (running [`Os`]). Every transition goes through [`Firmware`], behind the machine's lock,
//! so a power button, a Wake-on-LAN packet or a BMC call can each press it from its own task:
//! pressing "on" on a machine that is on does nothing, as on the real thing.
//!
//! It also knows whether the wall feeds the power supply (mains). A machine without a smart plug
//! always has it. Behind a plug whose relay is off it has none: nothing can turn it on, as a
//! machine unplugged from the wall has no standby power for its card, its BMC or its button.

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result, bail};

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

pub(crate) struct Firmware {
    os: Option<Os>,
    mains: bool,
}

impl Default for Firmware {
    fn default() -> Self {
        Self { os: None, mains: true }
    }
}

impl Firmware {
    pub fn state(&self) -> PowerState {
        if self.os.is_some() { PowerState::On } else { PowerState::Off }
    }

    pub fn os(&self) -> Option<&Os> {
        self.os.as_ref()
    }

    /// Whether the power supply is fed from the wall.
    pub fn mains(&self) -> bool {
        self.mains
    }

    /// The relay opens: the machine loses its power at once, as by [`Self::power_cut`], and
    /// nothing turns it on until mains is back.
    pub async fn mains_lost(&mut self, board: &Board) -> Result<()> {
        self.mains = false;
        self.power_cut(board).await
    }

    /// The relay closes: a machine whose firmware is set to power on when AC returns boots; any
    /// other stays off, waiting for a button, a magic packet or its BMC.
    pub async fn mains_back(&mut self, board: &Board) -> Result<()> {
        self.mains = true;
        if board.spec.power_on_with_ac { self.power_on(board).await } else { Ok(()) }
    }

    /// Off → On: boots containerd and the kubelet. On: nothing. Without mains it fails: there
    /// is no power to boot with.
    pub async fn power_on(&mut self, board: &Board) -> Result<()> {
        if self.os.is_some() {
            return Ok(());
        }
        if !self.mains {
            bail!("machine {} has no mains power (its plug's relay is off)", board.name);
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
