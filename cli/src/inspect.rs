//! `weightbay inspect`: a container's, sharded set's or checkpoint's tensors, metadata and
//! scalars, as a table or JSON.

use std::process::ExitCode;

use clap::Args;
use weightbay::{Reader, Result, Scalar};

use crate::escape::escaped;
use crate::reach::locate;
use crate::target::{self, Target, resolve};

/// The arguments of `weightbay inspect`.
#[derive(Args)]
pub(crate) struct InspectArgs {
    /// Path or URL.
    pub(crate) url: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Of a checkpoint prefix, this step instead of the latest.
    #[arg(long)]
    pub(crate) step: Option<u64>,
}

/// Runs `weightbay inspect`.
pub(crate) fn run(args: InspectArgs) -> Result<ExitCode> {
    let InspectArgs { url, json, step } = args;
    let readers = match resolve(&locate(&url)?)? {
        Target::Container(reader) => vec![(url, reader)],
        Target::Sharded(shards) => shards,
        Target::Checkpoints(checkpoints) => {
            let step = target::chosen(&checkpoints, step, false)?[0];
            target::containers(&checkpoints.open(step)?)?
        }
    };
    if json {
        // One container prints as before; several (shards) as a list naming each.
        let value = match readers.as_slice() {
            [(_, reader)] => inspect_json(reader),
            several => serde_json::Value::Array(
                several
                    .iter()
                    .map(|(key, reader)| {
                        let mut value = inspect_json(reader);
                        value["key"] = key.as_str().into();
                        value
                    })
                    .collect(),
            ),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        let several = readers.len() > 1;
        for (key, reader) in &readers {
            if several {
                println!("== {}", escaped(key));
            }
            print!("{}", inspect_table(reader));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect_table(reader: &Reader) -> String {
    let mut out = format!(
        "format: {}\nbytes: {}\ntensors: {}\nintegrity trailer: {}\n",
        reader.format(),
        reader.len(),
        reader.tensors().len(),
        if reader.has_trailer() { "yes" } else { "no" }
    );
    let rows: Vec<[String; 5]> = reader
        .tensors()
        .iter()
        .map(|t| {
            [
                escaped(t.name()).into_owned(),
                t.dtype().to_string(),
                format!("{:?}", t.shape()),
                t.byte_len().to_string(),
                t.range().start.to_string(),
            ]
        })
        .collect();
    let header = ["name", "dtype", "shape", "bytes", "offset"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            // Numbers right-aligned, text left-aligned.
            if i >= 3 {
                text += &format!("{cell:>width$}  ");
            } else {
                text += &format!("{cell:<width$}  ");
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    out += "\n";
    out += &line(header);
    for row in &rows {
        out += &line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
    }
    if !reader.metadata().is_empty() {
        out += "\nmetadata:\n";
        for (k, v) in reader.metadata() {
            out += &format!("  {} = {}\n", escaped(k), escaped(v));
        }
    }
    if !reader.scalars().is_empty() {
        out += "\nscalars:\n";
        for (k, v) in reader.scalars() {
            out += &format!("  {} = {v}\n", escaped(k));
        }
    }
    out
}

fn inspect_json(reader: &Reader) -> serde_json::Value {
    let tensors: Vec<serde_json::Value> = reader
        .tensors()
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name(),
                "dtype": t.dtype().to_string(),
                "shape": t.shape(),
                "bytes": t.byte_len(),
                "offset": t.range().start,
                "param_id": t.param_id(),
            })
        })
        .collect();
    let scalars: serde_json::Map<String, serde_json::Value> = reader
        .scalars()
        .iter()
        .map(|(k, v)| {
            let value = match *v {
                Scalar::Int(x) => serde_json::json!({ "int": x }),
                Scalar::UInt(x) => serde_json::json!({ "uint": x }),
                Scalar::Float(x) => serde_json::json!({ "float": x }),
                Scalar::Bool(x) => serde_json::json!({ "bool": x }),
            };
            (k.clone(), value)
        })
        .collect();
    serde_json::json!({
        "format": reader.format().to_string(),
        "bytes": reader.len(),
        "trailer": reader.has_trailer(),
        "tensors": tensors,
        "metadata": reader.metadata(),
        "scalars": scalars,
    })
}
