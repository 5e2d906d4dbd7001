//! `fallow catalog [--json]`: the GPU models the market knows, with their memory, compute units
//! (CU, throughput relative to one H100 SXM5) and the aliases drivers and traces use. Read from
//! the catalog built into the binary; no coordinator needed.

use clap::Args;
use model::{GpuCatalog, GpuSpec};
use serde_json::{Value, json};

use super::output::{Align, Table, print_json};

#[derive(Args)]
pub struct CatalogArgs {
    /// One JSON object per model (name, aliases, vendor, architecture, memory_mib,
    /// compute_units, cu_milli, dense_tflops, memory_bandwidth_gb_s, interconnect, tdp_w,
    /// disclosed).
    #[arg(long)]
    json: bool,
}

pub fn run(args: CatalogArgs) -> anyhow::Result<()> {
    super::die_quietly_on_closed_stdout();
    let catalog = GpuCatalog::embedded();
    if args.json {
        print_json(&Value::Array(catalog.models().map(|(_, spec)| as_json(spec)).collect()));
        return Ok(());
    }
    let mut table = Table::new(&[
        ("MODEL", Align::Left),
        ("VENDOR", Align::Left),
        ("MEMORY GiB", Align::Right),
        ("CU", Align::Right),
        ("TFLOPS", Align::Right),
        ("GB/s", Align::Right),
        ("TDP W", Align::Right),
        ("ALIASES", Align::Left),
    ]);
    for (_, spec) in catalog.models() {
        let vendor = if spec.disclosed {
            spec.vendor.clone()
        } else {
            format!("{} (assumed)", spec.vendor)
        };
        table.row(vec![
            spec.name.clone(),
            vendor,
            format!("{:.1}", f64::from(spec.memory_mib) / 1024.0),
            format!("{:.3}", f64::from(spec.cu_milli) / 1000.0),
            format!("{:.1}", spec.dense_tflops),
            spec.memory_bandwidth_gb_s.to_string(),
            spec.tdp_w.to_string(),
            spec.aliases.join(", "),
        ]);
    }
    table.print();
    Ok(())
}

fn as_json(spec: &GpuSpec) -> Value {
    json!({
        "name": spec.name,
        "aliases": spec.aliases,
        "vendor": spec.vendor,
        "architecture": spec.architecture,
        "memory_mib": spec.memory_mib,
        "compute_units": f64::from(spec.cu_milli) / 1000.0,
        "cu_milli": spec.cu_milli,
        "dense_tflops": spec.dense_tflops,
        "memory_bandwidth_gb_s": spec.memory_bandwidth_gb_s,
        "interconnect": spec.interconnect,
        "tdp_w": spec.tdp_w,
        "disclosed": spec.disclosed,
    })
}
