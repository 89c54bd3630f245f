//! Performance receipts: the CSV/JSON format written by `ferrite bench` and read back by
//! `ferrite bench --compare`, plus the facts about the run that a receipt must carry
//! (commit, CPU, SIMD level, model sha256 and type mix, date).
//!
//! A receipt is `# key: value` comment lines, one header line of column names, then one
//! numeric row per (frontier, batch). Every column is numeric so a reader needs no quoting
//! rules; everything textual lives in the comment block.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

/// Column names of a receipt, in order.
pub const COLUMNS: [&str; 16] = [
    "frontier",
    "batch",
    "prefill_from",
    "prefill_tokens",
    "gen_tokens",
    "runs",
    "load_ms",
    "ttft_ms_median",
    "ttft_ms_min",
    "ttft_ms_max",
    "prefill_tps_median",
    "prefill_tps_min",
    "prefill_tps_max",
    "decode_tps_median",
    "decode_tps_min",
    "decode_tps_max",
];

/// A receipt: descriptive header entries and numeric rows (one value per [`COLUMNS`] entry).
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    /// `# key: value` entries, in order.
    pub header: Vec<(String, String)>,
    /// Rows of `COLUMNS.len()` values.
    pub rows: Vec<Vec<f64>>,
}

impl Receipt {
    /// The header value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.header
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The CSV text.
    pub fn to_csv(&self) -> String {
        let mut out = String::new();
        for (k, v) in &self.header {
            out.push_str(&format!("# {k}: {}\n", one_line(v)));
        }
        out.push_str(&COLUMNS.join(","));
        out.push('\n');
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(|v| format_number(*v)).collect();
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    /// The same content as JSON: `{"header": {..}, "rows": [{column: value}, ..]}`.
    pub fn to_json(&self) -> serde_json::Value {
        let header: serde_json::Map<String, serde_json::Value> = self
            .header
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|row| {
                let m: serde_json::Map<String, serde_json::Value> = COLUMNS
                    .iter()
                    .zip(row)
                    .map(|(c, v)| ((*c).to_owned(), serde_json::json!(v)))
                    .collect();
                serde_json::Value::Object(m)
            })
            .collect();
        serde_json::json!({ "header": header, "rows": rows })
    }

    /// Parses receipt text; every column of [`COLUMNS`] must be present (in any order).
    pub fn parse(text: &str) -> anyhow::Result<Receipt> {
        let mut header = Vec::new();
        let mut columns: Option<Vec<&str>> = None;
        let mut rows = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if let Some(rest) = line.strip_prefix('#') {
                let (k, v) = rest
                    .trim_start()
                    .split_once(':')
                    .with_context(|| format!("line {}: comment is not `# key: value`", i + 1))?;
                header.push((k.trim().to_owned(), v.trim().to_owned()));
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let Some(cols) = &columns else {
                columns = Some(cells);
                continue;
            };
            if cells.len() != cols.len() {
                bail!(
                    "line {}: {} cells, the header has {}",
                    i + 1,
                    cells.len(),
                    cols.len()
                );
            }
            let mut row = Vec::with_capacity(COLUMNS.len());
            for want in COLUMNS {
                let at = cols
                    .iter()
                    .position(|c| *c == want)
                    .with_context(|| format!("column {want} is missing"))?;
                let v: f64 = cells[at]
                    .parse()
                    .with_context(|| format!("line {}: {want} = {:?}", i + 1, cells[at]))?;
                // Every column is a count, a duration or a rate: a NaN, infinite or negative
                // one is a broken receipt, which the comparison could not judge and would
                // wave through.
                if !(v.is_finite() && v >= 0.0) {
                    bail!(
                        "line {}: {want} = {v} is not a finite, non-negative number",
                        i + 1
                    );
                }
                row.push(v);
            }
            let (f, b) = (col("frontier"), col("batch"));
            if rows
                .iter()
                .any(|r: &Vec<f64>| r[f] == row[f] && r[b] == row[b])
            {
                bail!(
                    "line {}: a second row for frontier {} batch {}",
                    i + 1,
                    row[f],
                    row[b]
                );
            }
            rows.push(row);
        }
        if columns.is_none() {
            bail!("no column header line");
        }
        Ok(Receipt { header, rows })
    }

    /// Reads and parses a receipt file.
    pub fn read(path: &Path) -> anyhow::Result<Receipt> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading receipt {}", path.display()))?;
        Receipt::parse(&text).with_context(|| format!("parsing receipt {}", path.display()))
    }
}

/// Index of `name` in [`COLUMNS`].
pub fn col(name: &str) -> usize {
    COLUMNS
        .iter()
        .position(|c| *c == name)
        .unwrap_or(COLUMNS.len())
}

fn one_line(v: &str) -> String {
    v.replace(['\n', '\r'], " ")
}

/// Integers print without a fraction; rates keep three decimals.
fn format_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// Lowercase hex sha256 of a file (`ferrite_files::sha256_file`).
pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    Ok(ferrite_files::hex(&ferrite_files::sha256_file(path)?))
}

/// `TYPE:count` for each tensor type in the file, most common first.
pub fn type_mix(g: &ferrite_gguf::Gguf) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for t in g.tensors() {
        *counts.entry(t.ty.to_string()).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.iter()
        .map(|(t, n)| format!("{t}:{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The CPU's model name from /proc/cpuinfo, or "unknown".
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The commit this binary was built from: `FERRITE_GIT_COMMIT` when set (to label a binary
/// built elsewhere), else the commit the build script recorded (`build.rs`: with `-dirty`
/// for uncommitted changes, "unknown" outside a git checkout).
pub fn git_commit() -> String {
    match std::env::var("FERRITE_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => env!("FERRITE_BUILD_COMMIT").to_owned(),
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_utc(secs)
}

/// Formats seconds since the Unix epoch (proleptic Gregorian calendar, days-to-civil).
fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Receipt {
        Receipt {
            header: vec![
                ("model_sha256".into(), "ab".into()),
                ("flags".into(), "a\nb".into()),
            ],
            rows: vec![(0..COLUMNS.len()).map(|i| i as f64 + 0.5).collect()],
        }
    }

    #[test]
    fn csv_round_trips() {
        let r = sample();
        let back = Receipt::parse(&r.to_csv()).unwrap();
        assert_eq!(back.rows, r.rows);
        assert_eq!(back.get("model_sha256"), Some("ab"));
        assert_eq!(back.get("flags"), Some("a b"));
    }

    #[test]
    fn parse_rejects_missing_column_and_bad_numbers() {
        let csv = sample().to_csv().replace("decode_tps_max", "other");
        assert!(Receipt::parse(&csv).is_err());
        let csv = sample().to_csv().replace("1.500", "x");
        assert!(Receipt::parse(&csv).is_err());
        assert!(Receipt::parse("# a: b\n").is_err());
    }

    /// Regression: a receipt holding NaN, inf or a negative measurement parsed, and
    /// `--compare` judged such a row `investigate` and exited 0, so a broken receipt passed
    /// the regression gate; a second row for the same (frontier, batch) was silently ignored.
    #[test]
    fn parse_rejects_non_finite_or_negative_values_and_duplicate_rows() {
        let csv = sample().to_csv();
        assert!(csv.contains(",10.500,"), "{csv}");
        for bad in ["NaN", "inf", "-inf", "-1"] {
            let err = Receipt::parse(&csv.replace(",10.500,", &format!(",{bad},"))).unwrap_err();
            assert!(
                err.to_string().contains("prefill_tps_median"),
                "{bad}: {err}"
            );
        }
        let row = csv.lines().last().unwrap();
        let err = Receipt::parse(&format!("{csv}{row}\n")).unwrap_err();
        assert!(err.to_string().contains("frontier"), "{err}");
        // Zero is a value (prefill_from of a cold run).
        Receipt::parse(&csv.replace(",2.500,", ",0,")).unwrap();
    }

    #[test]
    fn dates_match_known_epochs() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        // 2000-03-01 is the day after a century leap day.
        assert_eq!(format_utc(951_868_800), "2000-03-01T00:00:00Z");
        assert_eq!(format_utc(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn json_has_every_column() {
        let j = sample().to_json();
        let row = &j["rows"][0];
        for c in COLUMNS {
            assert!(row[c].is_number(), "{c}");
        }
        assert_eq!(j["header"]["model_sha256"], "ab");
    }
}
