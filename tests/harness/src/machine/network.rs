//! The lan the real machines are cabled to: a network namespace of the test's own holding a
//! Linux bridge, whose address also serves the apiserver (through [`Relay`]). Each machine is a
//! network namespace of its own with a veth pair, one end in it (`eth0`) and the other on the
//! bridge. Addresses exist only inside these namespaces; the root namespace gets none of them,
//! only the relay's upstream connections to 127.0.0.1. The lan's namespace also holds the
//! standby side of the machines' cards, which hears magic packets for sleeping machines
//! (standby.rs).

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

use super::netns::{self, ip};
use super::relay::Relay;
use super::standby::{Cards, Standby};
use crate::process::Janitor;

/// The lan's /24 (inside its namespaces only); the bridge, the apiserver relay and the
/// machines' default gateway are `.1`, the machines `.11` onwards.
const LAN_PREFIX: [u8; 3] = [10, 213, 0];
/// The port the apiserver has on the lan (the relay listens there on the bridge's address).
pub const API_PORT: u16 = 6443;

/// Deletes the lan's namespace once the test process ends, or when the lan is dropped.
const LAN_JANITOR: &str = r#"ip netns delete "$1" 2>/dev/null; exit 0"#;

/// A lan with a bridge and the apiserver on it. Dropping it stops the relay and deletes the
/// namespace (machines go first: see [`super::Machine`]).
pub struct Lan {
    // Field order is drop order: no connection is relayed once the namespace goes.
    standby: Standby,
    _relay: Relay,
    _janitor: Janitor,
    /// Unique among the lans of every test process: names the namespaces and cgroups.
    id: String,
    netns: String,
    next_host: AtomicU8,
}

impl Lan {
    /// Creates the lan's namespace and bridge, and relays `api` (kube-apiserver on 127.0.0.1)
    /// to the bridge's address. Fails with a clear message where namespaces cannot be made.
    pub fn start(api: SocketAddr) -> Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!("hl{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let netns = format!("{id}-lan");
        netns::add(&netns)?;
        // From here on the janitor deletes the namespace, whatever fails next.
        let janitor = Janitor::run(LAN_JANITOR, &[netns.as_ref()])?;
        let gateway = format!("{}/24", Self::gateway());
        for args in [
            &["link", "add", "br0", "type", "bridge"][..],
            &["addr", "add", gateway.as_str(), "dev", "br0"],
            &["link", "set", "br0", "up"],
        ] {
            ip(&[&["-n", netns.as_str()], args].concat())?;
        }
        let listen = SocketAddr::from((Self::gateway(), API_PORT));
        let listener = netns::open_in(&netns, move || TcpListener::bind(listen))
            .context("listening for the apiserver relay on the lan")?;
        let relay = Relay::start(listener, api)?;
        let standby = Standby::start(&netns)?;
        Ok(Self {
            standby,
            _relay: relay,
            _janitor: janitor,
            id,
            netns,
            next_host: AtomicU8::new(11),
        })
    }

    /// The bridge's address: the apiserver and default gateway as the machines see them.
    pub fn gateway() -> Ipv4Addr {
        let [a, b, c] = LAN_PREFIX;
        Ipv4Addr::new(a, b, c, 1)
    }

    /// The apiserver's URL on the lan (its certificate does not name the address: a client
    /// sets `tls-server-name`).
    pub fn api_url() -> String {
        format!("https://{}:{API_PORT}", Self::gateway())
    }

    /// The lan's broadcast address, where Wake-on-LAN packets go.
    pub fn broadcast() -> Ipv4Addr {
        let [a, b, c] = LAN_PREFIX;
        Ipv4Addr::new(a, b, c, 255)
    }

    /// The MAC address of machine `host`'s card (locally administered, fixed, so a slot can
    /// name it before the machine exists).
    pub fn mac(host: u8) -> [u8; 6] {
        [0x52, 0x54, 0x00, 0xd5, 0x00, host]
    }

    /// The pod range of machine `host` (its CNI bridge's subnet, without the prefix length).
    pub fn pod_subnet(host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 214, host, 0)
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The lan's network namespace, as `ip netns` names it: where the bridge, the apiserver
    /// relay and the devices are, and every machine's address is reachable.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// Cables a new machine: creates its namespace `netns` with `eth0` on the bridge at the next
    /// free address, and a default route through the bridge. Returns its address and the link.
    pub(crate) fn cable(&self, netns: &str) -> Result<(Ipv4Addr, Link)> {
        let address = self.next_address()?;
        let host = address.octets()[3];
        netns::add(netns)?;
        let port = format!("m{host}");
        let cidr = format!("{address}/24");
        let gateway = Self::gateway().to_string();
        let lan = self.netns.as_str();
        // Both ends are made inside their namespaces: nothing is created in the root one.
        ip(&[
            "link", "add", "eth0", "netns", netns, "type", "veth", "peer", "name", &port, "netns",
            lan,
        ])?;
        ip(&["-n", lan, "link", "set", &port, "master", "br0"])?;
        ip(&["-n", lan, "link", "set", &port, "up"])?;
        let mac = Self::mac(host).map(|b| format!("{b:02x}")).join(":");
        ip(&["-n", netns, "link", "set", "eth0", "address", &mac])?;
        ip(&["-n", netns, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", netns, "link", "set", "eth0", "up"])?;
        ip(&["-n", netns, "route", "add", "default", "via", &gateway])?;
        // A pod reaches the other machines (a power Job's SSH, a BMC) as on a home lan whose
        // router knows each machine's pod range: the lan routes it back to the machine that
        // hosts the pod, so no NAT (and no iptables) is needed.
        let pods = format!("{}/24", Self::pod_subnet(host));
        ip(&["-n", lan, "route", "add", &pods, "via", &address.to_string()])?;
        netns::forward(lan)?;
        netns::forward(netns)?;
        let link =
            Link { lan: lan.to_owned(), port, mac: Self::mac(host), cards: self.standby.cards() };
        Ok((address, link))
    }
}

impl Lan {
    /// The next free address of the lan, for a machine or a device (a BMC, a plug).
    pub(crate) fn next_address(&self) -> Result<Ipv4Addr> {
        let host = self.next_host.fetch_add(1, Ordering::Relaxed);
        if host == 255 {
            bail!("the lan {} has no address left", self.netns);
        }
        let [a, b, c] = LAN_PREFIX;
        Ok(Ipv4Addr::new(a, b, c, host))
    }

    /// A device wired to the lan's switch itself (a smart plug): the next free address, on the
    /// bridge, in the lan's namespace, where the device's sockets are opened. No machine's cable
    /// stands between it and the others.
    pub(crate) fn attach_device(&self) -> Result<(Ipv4Addr, &str)> {
        let address = self.next_address()?;
        ip(&["-n", &self.netns, "addr", "add", &format!("{address}/24"), "dev", "br0"])?;
        Ok((address, &self.netns))
    }
}

/// A machine's cable: its veth end on the lan's bridge, and its card's standby side there.
pub struct Link {
    lan: String,
    port: String,
    mac: [u8; 6],
    cards: Cards,
}

impl Link {
    /// Unplugs the cable (the bridge's port goes down): the machine reaches nothing on the lan,
    /// the apiserver included; its processes keep running.
    pub fn cut(&self) -> Result<()> {
        ip(&["-n", &self.lan, "link", "set", &self.port, "down"])
    }

    /// Plugs it back in.
    pub fn restore(&self) -> Result<()> {
        ip(&["-n", &self.lan, "link", "set", &self.port, "up"])
    }

    /// `press` runs for every magic packet for the machine's card that the lan's standby
    /// listener hears, until the link goes (standby.rs).
    pub(crate) fn listen_in_standby(&self, press: impl Fn() + Send + Sync + 'static) {
        self.cards.plug(self.mac, press);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.cards.unplug(self.mac);
    }
}
