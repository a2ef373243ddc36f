//! Key encodings shared by the ordered indexes.

/// The tree key of `key` for an index whose keys are at most `max_key`
/// bytes: `key`, zero-padded to `max_key`, then one byte of its length.
/// Comparing tree keys bytewise orders keys as byte strings (a key sorts
/// before every longer key it is a prefix of), and no tree key is a prefix
/// of another, so variable-length keys share one ordered structure.
pub fn tree_key(key: &[u8], max_key: usize, out: &mut Vec<u8>) {
    debug_assert!(key.len() <= max_key && max_key < 256);
    out.clear();
    out.extend_from_slice(key);
    out.resize(max_key, 0);
    out.push(key.len() as u8);
}

/// The key a tree key encodes.
pub fn untree_key(tk: &[u8]) -> &[u8] {
    let (len, body) = tk.split_last().expect("a tree key has a length byte");
    &body[..(*len as usize).min(body.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_keys_order_like_their_keys() {
        let keys: [&[u8]; 6] = [b"", b"\0", b"a", b"a\0", b"ab", b"b"];
        let enc: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| {
                let mut v = Vec::new();
                tree_key(k, 4, &mut v);
                v
            })
            .collect();
        for w in enc.windows(2) {
            assert!(w[0] < w[1], "{w:?}");
        }
        for (k, e) in keys.iter().zip(&enc) {
            assert_eq!(untree_key(e), *k);
        }
    }
}
