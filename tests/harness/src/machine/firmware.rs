//! A real machine's power state, the one thing that starts and stops its software: `Off` or
//! `On` (running [`Os`]). Every transition goes through [`Firmware`], behind the machine's lock,
//! so a power button, a Wake-on-LAN packet or a BMC call can each press it from its own task:
//! pressing "on" on a machine that is on does nothing, as on the real thing.
//!
//! An `On` machine may be suspended to RAM (ACPI S3): every process of it frozen where it stands
//! (the cgroup v1 freezer, board.sh `freeze`) and its `eth0` down, so its address answers
//! nothing while its TCP connections survive (no RST), as a sleeping machine's do. It is still
//! `On` (Redfish reports S3 as On), and resuming (a magic packet, its power button) brings
//! `eth0` up and thaws the same processes: nothing is restarted. A shutdown request reaches no
//! OS while it sleeps and does nothing; a power cut kills it as any other, and brings `eth0`
//! back up for the next boot.
//!
//! It also knows whether the wall feeds the power supply (mains). A machine without a smart plug
//! always has it. Behind a plug whose relay is off it has none: nothing can turn it on, as a
//! machine unplugged from the wall has no standby power for its card, its BMC or its button.

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::os::Os;
use super::{Board, Lan};
use crate::machine::netns::ip;
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
    /// On and suspended to RAM.
    suspended: bool,
    /// On, frozen and its network down for a suspend that never came ([`Self::hang`]).
    hung: bool,
}

impl Default for Firmware {
    fn default() -> Self {
        Self { os: None, mains: true, suspended: false, hung: false }
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

    /// Whether the machine is on and suspended to RAM.
    pub fn suspended(&self) -> bool {
        self.suspended
    }

    /// Whether its processes are frozen: suspended, or hung on its way to sleep.
    pub fn frozen(&self) -> bool {
        self.suspended || self.hung
    }

    /// On → suspended: freezes every process of the machine, then takes its `eth0` down.
    /// Off, suspended or hung: nothing. A freeze that does not complete leaves it awake, and
    /// fails.
    pub async fn suspend(&mut self, board: &Board) -> Result<()> {
        if self.os.is_none() || self.frozen() {
            return Ok(());
        }
        let started = Instant::now();
        freeze_and_silence(board)
            .await
            .with_context(|| format!("suspending machine {}", board.name))?;
        self.suspended = true;
        progress(&format!("machine {} suspended in {:.1?}", board.name, started.elapsed()));
        Ok(())
    }

    /// On → hung on its way to sleep, as when a device's driver blocks the kernel's suspend:
    /// its processes frozen and its `eth0` down as for a suspend, but the machine never reaches
    /// sleep. It draws its running power, answers nothing, no magic packet wakes it and no OS
    /// acts on a shutdown; only a power cut ends it. Off, suspended or hung: nothing.
    pub async fn hang(&mut self, board: &Board) -> Result<()> {
        if self.os.is_none() || self.frozen() {
            return Ok(());
        }
        freeze_and_silence(board)
            .await
            .with_context(|| format!("hanging machine {}", board.name))?;
        self.hung = true;
        progress(&format!(
            "machine {} hung on its way to sleep (frozen, network down, not asleep)",
            board.name
        ));
        Ok(())
    }

    /// Suspended → On: `eth0` up, then the same processes thawed. Otherwise nothing.
    pub async fn resume(&mut self, board: &Board) -> Result<()> {
        if !self.suspended {
            return Ok(());
        }
        let started = Instant::now();
        board.set_card(true).with_context(|| format!("resuming machine {}", board.name))?;
        board.run("thaw", &[board.cgroups.root()]).await?;
        self.suspended = false;
        progress(&format!("machine {} resumed in {:.1?}", board.name, started.elapsed()));
        Ok(())
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
    /// containerd, shims, containers) is SIGKILLed, suspended or not. Off: nothing.
    pub async fn power_cut(&mut self, board: &Board) -> Result<()> {
        let Some(os) = self.os.take() else { return Ok(()) };
        let started = Instant::now();
        let asleep = std::mem::take(&mut self.suspended);
        let hung = std::mem::take(&mut self.hung);
        let cut = board.run("cut", &[board.cgroups.root()]).await.context("cutting the power");
        // Its processes are dead; the wrappers are reaped.
        drop(os);
        if asleep || hung {
            // The card comes back as it is at every power-on, listening on the machine's side.
            board.set_card(true).context("bringing eth0 up after a power cut with it down")?;
        }
        cut?;
        progress(&format!("machine {} power cut in {:.1?}", board.name, started.elapsed()));
        Ok(())
    }

    /// On → Off in order, as an OS shutdown does: the kubelet stops (SIGTERM), then every
    /// other process gets SIGTERM (containers first get the chance to exit cleanly), and what
    /// is left after a while is SIGKILLed. Off: nothing. Suspended or hung on its way to sleep:
    /// nothing either, as no OS is awake to act on the request.
    pub async fn shutdown(&mut self, board: &Board) -> Result<()> {
        if self.frozen() {
            progress(&format!("machine {} is not awake: the shutdown does nothing", board.name));
            return Ok(());
        }
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

/// What a suspend does first, and a hung one too: every process of the machine frozen, then its
/// `eth0` taken down. A step that fails is undone (the card up, the processes thawed).
async fn freeze_and_silence(board: &Board) -> Result<()> {
    let root = board.cgroups.root();
    let silenced = match board.run("freeze", &[root]).await {
        Ok(()) => board.set_card(false),
        Err(err) => Err(err),
    };
    if let Err(err) = silenced {
        board.set_card(true)?;
        board.run("thaw", &[root]).await?;
        return Err(err);
    }
    Ok(())
}

impl Board {
    /// The OS side of the machine's card: `eth0` in its namespace, down while it sleeps. Taking
    /// it down drops its routes; up again, the default route is put back (the connected one
    /// comes back with the link).
    fn set_card(&self, up: bool) -> Result<()> {
        let netns = self.netns.as_str();
        ip(&["-n", netns, "link", "set", "eth0", if up { "up" } else { "down" }])?;
        if up {
            let gateway = Lan::gateway().to_string();
            ip(&["-n", netns, "route", "replace", "default", "via", &gateway])?;
        }
        Ok(())
    }
}
