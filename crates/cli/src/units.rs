//! Parsing and printing of byte sizes ("4GiB", "8", "2MiB") for flags.

/// Parses a byte size: a number with an optional unit B, K/KB/KiB, M/MB/MiB,
/// G/GB/GiB, T/TB/TiB. Units are binary (1 KiB = 1 KB = 1024 B), as memory is.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if unit.starts_with(['.', ',']) {
        return Err(format!(
            "{s:?}: fractional sizes are not supported; use a smaller unit (e.g. 1536MiB)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 4KiB, 1GiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Formats a byte size with the largest exact binary unit.
pub fn format_size(b: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{}", b >> shift, unit);
        }
    }
    format!("{b}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2 MiB"), Ok(2 << 20));
        assert!(parse_size("1.5GiB").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("4XB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
        assert_eq!(format_size(1 << 30), "1GiB");
        assert_eq!(format_size(4096), "4KiB");
        assert_eq!(format_size(100), "100B");
    }
}
