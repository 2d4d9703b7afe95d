//! The agent's status as metrics text, for node_exporter's textfile collector: per source the
//! catalog, the warm-up (copies placed, still to place), what the programs were served from,
//! and what the agent read from the source; per tier directory its use. `granary status
//! --metrics-file PATH` writes it.
//!
//! The format is Prometheus's text exposition format, which the textfile collector parses:
//! a counter's `# TYPE` line names it with its `_total` suffix. (OpenMetrics names the family
//! without the suffix and ends with `# EOF`; a Prometheus-format parser then takes the samples
//! for another, untyped family. The two cannot both be met for counters.)

use std::fmt::Write;

use crate::protocol::AgentStatus;

/// The metrics text of the agent's status `s` (`None`: no agent runs).
pub fn render(s: Option<&AgentStatus>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# TYPE granary_agent_up gauge");
    let _ = writeln!(
        out,
        "# HELP granary_agent_up Whether the user's agent runs on this node."
    );
    let _ = writeln!(out, "granary_agent_up {}", u8::from(s.is_some()));
    let Some(s) = s else {
        return out;
    };
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, u64)>| {
        let sample = if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        let _ = writeln!(out, "# TYPE {sample} {kind}");
        let _ = writeln!(out, "# HELP {sample} {help}");
        for (labels, v) in rows {
            let _ = writeln!(out, "{sample}{labels} {v}");
        }
    };
    let src = |p: &std::path::Path| format!("{{source=\"{}\"}}", escape(&p.display().to_string()));
    let from = |p: &std::path::Path, f: &str| {
        format!(
            "{{source=\"{}\",from=\"{f}\"}}",
            escape(&p.display().to_string())
        )
    };
    family(
        "granary_agent_jobs",
        "gauge",
        "Jobs attached to the node's agent.",
        vec![(String::new(), s.jobs as u64)],
    );
    family(
        "granary_agent_uptime_seconds",
        "gauge",
        "Seconds since the agent started.",
        vec![(String::new(), s.uptime_s as u64)],
    );
    let per = |f: &dyn Fn(&crate::protocol::SourceStatus) -> u64| -> Vec<(String, u64)> {
        s.sources.iter().map(|x| (src(&x.source), f(x))).collect()
    };
    // A busy source's catalog was not read (it is being listed or saved): no sample, rather
    // than a zero a graph would show as an emptied dataset.
    let known = |f: &dyn Fn(&crate::protocol::SourceStatus) -> u64| -> Vec<(String, u64)> {
        s.sources
            .iter()
            .filter(|x| !x.busy)
            .map(|x| (src(&x.source), f(x)))
            .collect()
    };
    family(
        "granary_catalog_files",
        "gauge",
        "Regular files in the source's catalog.",
        known(&|x| x.catalog.files),
    );
    family(
        "granary_catalog_bytes",
        "gauge",
        "Bytes of the source's regular files.",
        known(&|x| x.catalog.bytes),
    );
    family(
        "granary_placed_files",
        "gauge",
        "Files of the source with a complete copy in a tier now.",
        per(&|x| x.files_placed_now),
    );
    family(
        "granary_placed_bytes",
        "gauge",
        "Bytes of the source with a complete copy in a tier now (warm-up: over catalog bytes).",
        per(&|x| x.bytes_placed_now),
    );
    family(
        "granary_pending_files",
        "gauge",
        "Files of the source being placed or queued for placement.",
        per(&|x| x.pending),
    );
    family(
        "granary_served_opens",
        "counter",
        "Programs' opens of the source's files, by where they were served from.",
        s.sources
            .iter()
            .flat_map(|x| {
                [
                    (from(&x.source, "tier"), x.served.tier_opens),
                    (from(&x.source, "source"), x.served.source_opens),
                ]
            })
            .collect(),
    );
    family(
        "granary_served_bytes",
        "counter",
        "Bytes the programs read of the source's files, by where they were served from.",
        s.sources
            .iter()
            .flat_map(|x| {
                [
                    (from(&x.source, "tier"), x.served.tier_bytes),
                    (from(&x.source, "source"), x.served.source_bytes),
                ]
            })
            .collect(),
    );
    family(
        "granary_agent_source_bytes",
        "counter",
        "Bytes the agent read from the source (placement copies).",
        per(&|x| x.placement.agent_source_bytes),
    );
    let tier = |p: &std::path::Path| format!("{{tier=\"{}\"}}", escape(&p.display().to_string()));
    family(
        "granary_tier_capacity_bytes",
        "gauge",
        "A tier directory's capacity.",
        s.tiers
            .iter()
            .map(|t| (tier(&t.path), t.capacity))
            .collect(),
    );
    family(
        "granary_tier_used_bytes",
        "gauge",
        "Bytes of complete copies in a tier directory.",
        s.tiers.iter().map(|t| (tier(&t.path), t.used)).collect(),
    );
    out
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_typed_and_counters_end_in_total() {
        let status: AgentStatus = serde_json::from_value(serde_json::json!({
            "pid": 1, "uptime_s": 3.0, "jobs": 1, "idle_timeout_s": 30.0,
            "runtime_dir": "/run/g", "tiers": [], "sources": []
        }))
        .unwrap();
        let m = render(Some(&status));
        assert!(m.starts_with("# TYPE granary_agent_up gauge\n"), "{m}");
        assert!(render(None).contains("granary_agent_up 0\n"));
        assert!(m.contains("# TYPE granary_agent_jobs gauge\n"), "{m}");
        assert!(m.contains("granary_agent_jobs 1\n"), "{m}");
        assert!(
            m.contains("# TYPE granary_served_opens_total counter\n"),
            "{m}"
        );
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
