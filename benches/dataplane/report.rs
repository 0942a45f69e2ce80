//! Printing figures: aligned tables, and the statistics they show.

use std::time::Duration;

/// A table printed with its columns aligned, numbers to the right.
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: impl Into<String>, header: &[&str]) -> Table {
        Table {
            title: title.into(),
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        let columns = self.header.len();
        let width: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .chain([&self.header[c]])
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let cells: Vec<String> = cells
                .iter()
                .zip(&width)
                .enumerate()
                .map(|(i, (cell, w))| {
                    // The first column names the row; the rest are figures.
                    if i == 0 {
                        format!("{cell:<w$}")
                    } else {
                        format!("{cell:>w$}")
                    }
                })
                .collect();
            println!("  {}", cells.join("  ").trim_end());
        };
        println!("\n{}", self.title);
        line(&self.header);
        let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule);
        for row in &self.rows {
            line(row);
        }
    }
}

/// The value at quantile `q` (nearest rank) of unsorted samples.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or_default()
}

pub fn median(samples: &[Duration]) -> Duration {
    quantile(samples, 0.5)
}

pub fn min(samples: &[Duration]) -> Duration {
    samples.iter().min().copied().unwrap_or_default()
}

pub fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

pub fn millis(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

pub fn ratio(a: Duration, b: Duration) -> String {
    if b.is_zero() {
        return "-".into();
    }
    format!("{:.2}", a.as_secs_f64() / b.as_secs_f64())
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

/// A figure that could not be taken, with why, in place of a number.
pub fn missing(why: &str) -> String {
    format!("({why})")
}
