//! Human sizes (`8G`, `512M`, `1.5T`, `4096`) and durations (`30s`, `5m`, `250ms`): one grammar
//! for flags, the configuration file, variables and the docs. Units are binary: `1K` = 1024
//! bytes; `KiB`/`KB`/`K` all mean the same; `K M G T P E`.

/// Parses a size; `None` when it is not one. A fraction needs a unit (`1.5G`): `1.5` bytes is
/// a typo, not a size.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        "e" => 60,
        _ => return None,
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(1u64 << shift);
    }
    if shift == 0 {
        return None;
    }
    let f: f64 = num.parse().ok()?;
    let v = f * (1u64 << shift) as f64;
    if !v.is_finite() || v < 0.0 || v >= u64::MAX as f64 {
        return None;
    }
    Some(v as u64)
}

/// The smallest tier capacity: one 4 KiB block (the default accounting block).
pub const MIN_CAPACITY: u64 = 4096;
/// The largest: 1 EiB, beyond any file system a node mounts.
pub const MAX_CAPACITY: u64 = 1 << 60;

/// A tier's capacity: a size from one 4 KiB block to 1 EiB. The error says what is wrong.
pub fn parse_capacity(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let v = parse_size(t).ok_or_else(|| {
        if t.parse::<f64>().is_ok() {
            format!("`{t}` is not a size: a fraction needs a unit (like 1.5G)")
        } else {
            format!("`{t}` is not a size (like 8G, 512M, 1.5T)")
        }
    })?;
    check_capacity(v).map_err(|why| format!("capacity `{t}` {why}"))
}

/// `v` as a tier capacity, or why it cannot be one.
pub fn check_capacity(v: u64) -> Result<u64, String> {
    if v < MIN_CAPACITY {
        return Err(format!(
            "({v} bytes) is less than one 4 KiB block: the tier could hold nothing"
        ));
    }
    if v > MAX_CAPACITY {
        return Err(format!(
            "({}) is more than 1 EiB: no file system is that large",
            format_size(v)
        ));
    }
    Ok(v)
}

/// `42.1 GiB`-style rendering for messages and tables.
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Parses a duration: a number of seconds, or a number with `ms`, `s`, `m`, `h`.
pub fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "" | "s" => v,
        "ms" => v / 1000.0,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        "d" => v * 86400.0,
        _ => return None,
    };
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(std::time::Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("1.5T"), Some(3 << 39));
        assert_eq!(parse_size("1 GB"), Some(1 << 30));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("8X"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999P"), None);
        assert_eq!(parse_size("16E"), None, "beyond 64 bits");
        assert_eq!(parse_size("1.5"), None, "a fraction of a byte");
        assert_eq!(parse_size("0.5K"), Some(512));
    }

    #[test]
    fn capacities() {
        assert_eq!(parse_capacity("8G"), Ok(8 << 30));
        assert_eq!(parse_capacity("4K"), Ok(4096));
        let e = parse_capacity("1.5").unwrap_err();
        assert!(e.contains("a fraction needs a unit"), "{e}");
        let e = parse_capacity("0").unwrap_err();
        assert!(e.contains("less than one 4 KiB block"), "{e}");
        let e = parse_capacity("100").unwrap_err();
        assert!(e.contains("less than one 4 KiB block"), "{e}");
        assert_eq!(
            parse_capacity("1E"),
            Ok(1 << 60),
            "the largest, as the docs say"
        );
        assert_eq!(parse_capacity("1EiB"), Ok(1 << 60));
        let e = parse_capacity("2E").unwrap_err();
        assert!(e.contains("more than 1 EiB"), "{e}");
        let e = parse_capacity("2000P").unwrap_err();
        assert!(e.contains("more than 1 EiB"), "{e}");
        let e = parse_capacity("lots").unwrap_err();
        assert!(e.contains("is not a size"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("30"),
            Some(std::time::Duration::from_secs(30))
        );
        assert_eq!(
            parse_duration("2m"),
            Some(std::time::Duration::from_secs(120))
        );
        assert_eq!(
            parse_duration("250ms"),
            Some(std::time::Duration::from_millis(250))
        );
        assert_eq!(
            parse_duration("7d"),
            Some(std::time::Duration::from_secs(7 * 86400))
        );
        assert_eq!(parse_duration("x"), None);
    }

    #[test]
    fn format() {
        assert_eq!(format_size(10), "10 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(8 << 30), "8.0 GiB");
    }
}
