//! Latency summaries and medians across repeated runs.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Mean and percentiles of one row's latencies, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

impl Summary {
    /// Summarizes samples.
    pub fn of(samples: &mut [Duration]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        samples.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let pick = |q: f64| us(samples[((samples.len() - 1) as f64 * q).round() as usize]);
        let mean = samples.iter().map(|d| us(*d)).sum::<f64>() / samples.len() as f64;
        Summary { mean, p50: pick(0.5), p99: pick(0.99) }
    }

    /// The field-wise median of several summaries (one per repeat).
    pub fn median(all: &[Summary]) -> Summary {
        Summary {
            mean: median(all.iter().map(|s| s.mean).collect()),
            p50: median(all.iter().map(|s| s.p50).collect()),
            p99: median(all.iter().map(|s| s.p99).collect()),
        }
    }
}

/// The median of some numbers (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Times `iterations` calls of `f` after a short warm-up; returns each call's duration.
pub fn time_each(iterations: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<Vec<Duration>, String> {
    for _ in 0..(iterations / 20).max(3) {
        f()?;
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = std::time::Instant::now();
        f()?;
        samples.push(t.elapsed());
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_and_medians() {
        let mut s: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let sum = Summary::of(&mut s);
        assert_eq!(sum.p50, 51.0);
        assert_eq!(sum.p99, 99.0);
        assert!((sum.mean - 50.5).abs() < 1e-9);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
