//! A UPS's variables as the operator understands them. NUT reports the power source in
//! `ups.status`, a list of flags: `OL` on line power, `OB` on battery, `LB` low battery (with
//! `OB`, shutdown is near), and others (`CHRG`, `DISCHRG`, `RB`, `BYPASS`...) that change nothing
//! here.

use crate::api::PowerSource;

/// One reading of a UPS.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpsReading {
    /// `ups.status` as the server gave it.
    pub status: String,
    /// `battery.charge`, in percent.
    pub charge_percent: Option<f64>,
    /// `battery.runtime`, in seconds.
    pub runtime_seconds: Option<i64>,
    /// `ups.load`, in percent.
    pub load_percent: Option<f64>,
}

impl UpsReading {
    /// The reading of `LIST VAR`'s name/value pairs. `None`: no `ups.status` among them.
    pub fn from_vars<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Self> {
        let mut reading = UpsReading::default();
        let mut status = None;
        for (name, value) in vars {
            let value = value.trim();
            match name {
                "ups.status" => status = Some(value.to_owned()),
                "battery.charge" => reading.charge_percent = number(value),
                "battery.runtime" => {
                    // Whole seconds: some drivers print `1080.00`.
                    reading.runtime_seconds = number(value).map(|s| s.round() as i64);
                }
                "ups.load" => reading.load_percent = number(value),
                _ => {}
            }
        }
        reading.status = status?;
        Some(reading)
    }

    fn has(&self, flag: &str) -> bool {
        self.status.split_whitespace().any(|f| f == flag)
    }

    /// Where the power comes from, or why the reading does not say. `OB` wins over `OL` (a
    /// driver caught mid-change may report both); `LB` counts only on battery: a UPS back on
    /// line power reports `OL LB` while it recharges.
    pub fn source(&self) -> Result<PowerSource, String> {
        match (self.has("OB"), self.has("OL")) {
            (true, _) if self.has("LB") => Ok(PowerSource::LowBattery),
            (true, _) => Ok(PowerSource::Battery),
            (false, true) => Ok(PowerSource::Mains),
            (false, false) => Err(format!(
                "ups.status {:?} says neither OL (on line) nor OB (on battery)",
                self.status
            )),
        }
    }
}

/// A finite number, or nothing: a driver that prints garbage is treated as silent on it.
fn number(text: &str) -> Option<f64> {
    text.parse::<f64>().ok().filter(|n| n.is_finite() && *n >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(status: &str) -> UpsReading {
        UpsReading { status: status.to_owned(), ..UpsReading::default() }
    }

    #[test]
    fn the_status_flags_name_the_source() {
        use PowerSource::*;
        let cases: &[(&str, Result<PowerSource, ()>)] = &[
            ("OL", Ok(Mains)),
            ("OL CHRG", Ok(Mains)),
            ("OL LB", Ok(Mains)),
            ("OB", Ok(Battery)),
            ("OB DISCHRG", Ok(Battery)),
            ("OL OB DISCHRG", Ok(Battery)),
            ("OB LB", Ok(LowBattery)),
            ("LB OB DISCHRG", Ok(LowBattery)),
            ("FSD OB LB", Ok(LowBattery)),
            ("OFF", Err(())),
            ("", Err(())),
            ("OLB", Err(())),
        ];
        for (status, expected) in cases {
            assert_eq!(reading(status).source().map_err(|_| ()), *expected, "{status:?}");
        }
    }

    #[test]
    fn variables_read_as_numbers_or_not_at_all() {
        let vars = [
            ("ups.status", "OB DISCHRG"),
            ("battery.charge", "73"),
            ("battery.runtime", "1080.00"),
            ("ups.load", "nan"),
            ("device.model", "Back-UPS"),
        ];
        let r = UpsReading::from_vars(vars).expect("has ups.status");
        assert_eq!(r.status, "OB DISCHRG");
        assert_eq!(r.charge_percent, Some(73.0));
        assert_eq!(r.runtime_seconds, Some(1080));
        assert_eq!(r.load_percent, None);
        assert_eq!(UpsReading::from_vars([("battery.charge", "10")]), None);
        let negative = UpsReading::from_vars([("ups.status", "OL"), ("battery.charge", "-3")]);
        assert_eq!(negative.and_then(|r| r.charge_percent), None);
    }
}
