//! Human sizes (`8G`, `512M`, `1.5T`, `4096`) and durations (`30s`, `5m`, `250ms`).
//! Units are binary: `1K` = 1024 bytes; `KiB`/`KB`/`K` all mean the same.

/// Parses a size; `None` when it is not one.
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
        _ => return None,
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(1u64 << shift);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * (1u64 << shift) as f64;
    if !v.is_finite() || v < 0.0 || v >= u64::MAX as f64 {
        return None;
    }
    Some(v as u64)
}

/// `42.1 GiB`-style rendering for messages and tables.
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
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
        assert_eq!(parse_duration("x"), None);
    }

    #[test]
    fn format() {
        assert_eq!(format_size(10), "10 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(8 << 30), "8.0 GiB");
    }
}
