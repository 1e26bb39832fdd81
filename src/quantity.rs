//! Kubernetes resource quantities (`16Gi`, `16777216Ki`, `500m`, `1e3`) as exact values, so two
//! spellings of one amount compare equal. k8s-openapi's `Quantity` is only the string.
//!
//! The grammar is apimachinery's: a signed decimal number, then a binary suffix (`Ki` … `Ei`),
//! a decimal one (`m`, none, `k`, `M` … `E`) or a decimal exponent (`e3`, `E-2`). Values are held
//! in thousandths as an `i128`; like the apiserver, a value finer than a thousandth is rounded
//! up to the next one.

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a quantity: {1}")]
    Invalid(String, &'static str),
    #[error("{0:?} is too large to compare")]
    TooLarge(String),
}

/// An amount in thousandths of its unit (`1` is `1000`, `500m` is `500`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Milli(pub i128);

/// Parses `text` as a Kubernetes quantity.
pub fn parse(text: &str) -> Result<Milli, QuantityError> {
    let invalid = |why| QuantityError::Invalid(text.to_string(), why);
    let too_large = || QuantityError::TooLarge(text.to_string());

    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(invalid("no digits"));
    }
    if fraction.contains('.') {
        return Err(invalid("more than one decimal point"));
    }
    // The value is mantissa / 10^scale, times 2^binary.
    let mut mantissa: i128 = 0;
    for digit in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(digit - b'0')))
            .ok_or_else(too_large)?;
    }
    let mut scale = i64::try_from(fraction.len()).map_err(|_| too_large())?;
    let mut binary = 0u32;
    match suffix {
        "Ki" => binary = 10,
        "Mi" => binary = 20,
        "Gi" => binary = 30,
        "Ti" => binary = 40,
        "Pi" => binary = 50,
        "Ei" => binary = 60,
        "m" => scale += 3,
        "" => {}
        "k" => scale -= 3,
        "M" => scale -= 6,
        "G" => scale -= 9,
        "T" => scale -= 12,
        "P" => scale -= 15,
        "E" => scale -= 18,
        _ => {
            let exponent =
                suffix.strip_prefix(['e', 'E']).ok_or_else(|| invalid("unknown suffix"))?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid("the exponent is not an integer"));
            }
            let exponent: i64 = exponent.parse().map_err(|_| too_large())?;
            scale = scale.checked_sub(exponent).ok_or_else(too_large)?;
        }
    }
    mantissa = mantissa.checked_mul(1i128 << binary).ok_or_else(too_large)?;
    // Thousandths: mantissa * 10^(3 - scale), rounded up when that divides.
    let shift = 3 - scale;
    let milli = if mantissa == 0 {
        0
    } else if shift >= 0 {
        let factor =
            u32::try_from(shift).ok().and_then(|s| 10i128.checked_pow(s)).ok_or_else(too_large)?;
        mantissa.checked_mul(factor).ok_or_else(too_large)?
    } else {
        // A divisor beyond i128 leaves a positive mantissa under one thousandth: rounds to 1.
        let divisor = u32::try_from(-shift).ok().and_then(|s| 10i128.checked_pow(s));
        divisor.map_or(1, |d| mantissa / d + i128::from(mantissa % d != 0))
    };
    Ok(Milli(if negative { -milli } else { milli }))
}

/// Whether `a` and `b` are the same amount; `Err` names the one that is not a quantity.
pub fn same(a: &str, b: &str) -> Result<bool, QuantityError> {
    Ok(parse(a)? == parse(b)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_amount_are_equal() {
        let equal = [
            ("16Gi", "16777216Ki"),
            ("16Gi", "17179869184"),
            ("1Ki", "1024"),
            ("1.5Gi", "1536Mi"),
            ("1", "1000m"),
            ("0.5", "500m"),
            (".5", "500m"),
            ("1.", "1"),
            ("1k", "1000"),
            ("1e3", "1k"),
            ("1E3", "1000"),
            ("1e+3", "1000"),
            ("1e-3", "1m"),
            ("2M", "2e6"),
            ("1Ei", "1152921504606846976"),
            ("8E", "8e18"),
            ("0", "0Gi"),
            ("+4", "4"),
            ("-1", "-1000m"),
            ("110", "110"),
        ];
        for (a, b) in equal {
            assert_eq!(same(a, b), Ok(true), "{a} vs {b}");
        }
    }

    #[test]
    fn different_amounts_are_not_equal() {
        let different =
            [("16Gi", "16G"), ("16Gi", "16777215Ki"), ("1", "1001m"), ("1k", "1Ki"), ("4", "-4")];
        for (a, b) in different {
            assert_eq!(same(a, b), Ok(false), "{a} vs {b}");
        }
    }

    #[test]
    fn values_finer_than_a_thousandth_round_up() {
        assert_eq!(parse("0.1m"), Ok(Milli(1)));
        assert_eq!(parse("1.0001"), Ok(Milli(1001)));
        assert_eq!(parse("1e-30"), Ok(Milli(1)));
        assert_eq!(parse("1e-300"), Ok(Milli(1)));
        // The largest mantissa an i128 holds, divided: rounded up without overflowing.
        let largest = format!("{}e-4", i128::MAX);
        assert_eq!(parse(&largest), Ok(Milli(i128::MAX / 10 + 1)));
    }

    #[test]
    fn what_is_not_a_quantity_is_an_error_never_a_panic() {
        let invalid = [
            "", "Gi", "-", ".", "16 Gi", "16gi", "16GB", "1.2.3", "1e", "1e+", "1ex", "abc", "1..",
            "--1", "1Ki ", " 1",
        ];
        for text in invalid {
            assert!(
                matches!(parse(text), Err(QuantityError::Invalid(..))),
                "{text:?}: {:?}",
                parse(text)
            );
        }
        for text in ["1e40", "99999999999999999999999999999999999999999", "999999999999999999Ei"] {
            assert!(matches!(parse(text), Err(QuantityError::TooLarge(_))), "{text}");
        }
        assert_eq!(
            parse("16GB").unwrap_err().to_string(),
            "\"16GB\" is not a quantity: unknown suffix"
        );
    }
}
