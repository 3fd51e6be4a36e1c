//! The chunk size mix: weighted size ranges, drawn deterministically.
//!
//! Real loops are mostly short text deltas with the odd large tool
//! response, and a relay's cost per chunk and per byte differ, so the mix
//! matters more than any single size. A mix is written
//! `MIN-MAX:WEIGHT,…` (sizes in bytes, `K`/`M`/`G` suffixes allowed); the
//! default is `20-200:95,2K-20K:5`.

use std::fmt;
use std::str::FromStr;

/// Weighted ranges of chunk sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix {
    ranges: Vec<(usize, usize, u32)>,
    total: u32,
}

/// A mix that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("size mix {0:?} is not MIN-MAX:WEIGHT[,…] (e.g. 20-200:95,2K-20K:5)")]
pub struct MixError(String);

impl Default for Mix {
    fn default() -> Self {
        Mix {
            ranges: vec![(20, 200, 95), (2 << 10, 20 << 10, 5)],
            total: 100,
        }
    }
}

impl Mix {
    /// Every chunk of exactly `size` bytes.
    pub fn fixed(size: usize) -> Self {
        Mix {
            ranges: vec![(size, size, 1)],
            total: 1,
        }
    }

    /// The next size.
    pub fn draw(&self, rng: &mut fastrand::Rng) -> usize {
        let mut pick = rng.u32(0..self.total);
        for &(min, max, weight) in &self.ranges {
            if pick < weight {
                return rng.usize(min..=max);
            }
            pick -= weight;
        }
        self.ranges.last().map_or(0, |&(min, _, _)| min)
    }

    /// The largest size the mix can draw.
    pub fn max(&self) -> usize {
        self.ranges
            .iter()
            .map(|&(_, max, _)| max)
            .max()
            .unwrap_or(0)
    }
}

/// A byte count with an optional `K`, `M` or `G` suffix (powers of 1024).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, scale) = match text.as_bytes().last()? {
        b'K' | b'k' => (&text[..text.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&text[..text.len() - 1], 1 << 20),
        b'G' | b'g' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

fn size(text: &str) -> Option<usize> {
    usize::try_from(parse_bytes(text)?).ok()
}

impl FromStr for Mix {
    type Err = MixError;

    fn from_str(text: &str) -> Result<Self, MixError> {
        let bad = || MixError(text.to_owned());
        let mut ranges = Vec::new();
        for part in text.split(',') {
            let (range, weight) = part.split_once(':').unwrap_or((part, "1"));
            let (min, max) = range.split_once('-').unwrap_or((range, range));
            let (min, max) = (size(min).ok_or_else(bad)?, size(max).ok_or_else(bad)?);
            let weight: u32 = weight.trim().parse().map_err(|_| bad())?;
            if min > max || weight == 0 {
                return Err(bad());
            }
            ranges.push((min, max, weight));
        }
        let total = ranges
            .iter()
            .try_fold(0u32, |sum, r| sum.checked_add(r.2))
            .ok_or_else(bad)?;
        if ranges.is_empty() || total == 0 {
            return Err(bad());
        }
        Ok(Mix { ranges, total })
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (min, max, weight)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{min}-{max}:{weight}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let mix: Mix = "20-200:95,2K-20K:5".parse().expect("parses");
        assert_eq!(mix, Mix::default());
        assert_eq!(mix.to_string(), "20-200:95,2048-20480:5");
        assert_eq!("64K".parse::<Mix>().expect("fixed"), Mix::fixed(64 << 10));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes("12"), Some(12));
        assert_eq!(parse_bytes("x"), None);
        for bad in ["", "a-b:1", "200-20:1", "20-200:0", "20-200:x"] {
            assert!(bad.parse::<Mix>().is_err(), "{bad}");
        }
    }

    #[test]
    fn draws_within_ranges_by_weight() {
        let mix = Mix::default();
        let mut rng = fastrand::Rng::with_seed(7);
        let sizes: Vec<usize> = (0..10_000).map(|_| mix.draw(&mut rng)).collect();
        assert!(
            sizes
                .iter()
                .all(|&s| (20..=200).contains(&s) || (2048..=20480).contains(&s))
        );
        let large = sizes.iter().filter(|&&s| s >= 2048).count();
        assert!((300..700).contains(&large), "about 5% large: {large}");
        let mut again = fastrand::Rng::with_seed(7);
        assert_eq!(mix.draw(&mut again), sizes[0], "deterministic");
    }
}
