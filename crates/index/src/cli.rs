//! Value parsers for index configurations exposed as command-line flags
//! (feature `cli`): each index's config derives `clap::Args` and names
//! these for its sizes, durations and switches.

/// Parses a byte size: `4096`, `64KiB`, `1MiB`, `2GB` (binary and decimal
/// units, as `bytesize` reads them).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let b: bytesize::ByteSize = s
        .parse()
        .map_err(|e| format!("{s:?} is not a size (e.g. 4096, 64KiB, 1MiB): {e}"))?;
    usize::try_from(b.as_u64()).map_err(|_| format!("{s:?} is too large"))
}

/// Parses a byte size into a `u64`.
pub fn parse_size_u64(s: &str) -> Result<u64, String> {
    parse_size(s).map(|v| v as u64)
}

/// Parses a duration (`50us`, `100ms`, `1s`) into nanoseconds.
pub fn parse_nanos(s: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration (e.g. 50us, 100ms, 1s): {e}"))?;
    u64::try_from(d.as_nanos()).map_err(|_| format!("{s:?} is too long"))
}

/// Parses a switch: `on` or `off` (also `true`/`false`, `yes`/`no`, `1`/`0`).
pub fn parse_switch(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{s:?}: expected on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert_eq!(parse_nanos("50us"), Ok(50_000));
        assert!(parse_nanos("soon").is_err());
        assert_eq!(
            (parse_switch("on"), parse_switch("off")),
            (Ok(true), Ok(false))
        );
        assert!(parse_switch("maybe").is_err());
    }
}
