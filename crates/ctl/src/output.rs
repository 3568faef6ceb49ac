//! Output formats of `get` and the text of `describe`.

use std::io::Write;
use std::time::SystemTime;

use gantry_api::v1::{ConditionStatus, Gateway, Phase};

use crate::errors::CtlError;
use crate::template::{custom_columns, Path, Template};
use gantry_client::manifest::{self, GatewayDoc};

/// `-o` formats.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    Table,
    Wide,
    Json,
    Yaml,
    Name,
    /// `jsonpath=TEMPLATE`: kubectl's template subset over the JSON of
    /// the object (one name) or of the list.
    JsonPath(Template),
    /// `custom-columns=HEADER:PATH,...`.
    CustomColumns(Vec<(String, Path)>),
}

impl Format {
    /// Parses `-o`: table, wide, json, yaml, name, jsonpath=..., custom-columns=...
    pub fn parse(text: &str) -> Result<Format, String> {
        let fail = |e: crate::template::TemplateError| e.to_string();
        Ok(match text {
            "table" => Format::Table,
            "wide" => Format::Wide,
            "json" => Format::Json,
            "yaml" => Format::Yaml,
            "name" => Format::Name,
            _ => match text.split_once('=') {
                Some(("jsonpath", t)) => Format::JsonPath(Template::parse(t).map_err(fail)?),
                Some(("custom-columns", c)) => Format::CustomColumns(custom_columns(c).map_err(fail)?),
                _ => {
                    return Err(format!(
                        "unknown output format {text:?}: use table, wide, json, yaml, name, jsonpath=TEMPLATE or custom-columns=HEADER:.path,..."
                    ))
                }
            },
        })
    }

    /// Whether the format is a table (so `--no-headers` and
    /// `--show-labels` apply).
    fn is_table(&self) -> bool {
        matches!(self, Format::Table | Format::Wide | Format::CustomColumns(_))
    }
}

/// How `get` prints besides the format.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrintOptions {
    /// One object asked for by name (json, yaml and jsonpath print it
    /// rather than a list).
    pub single: bool,
    /// The header row of a table.
    pub headers: bool,
    /// A LABELS column.
    pub show_labels: bool,
    /// Sort by this field (`--sort-by`).
    pub sort_by: Option<Path>,
    /// The revision a list was read at: its `metadata.resourceVersion`,
    /// from which a watch continues.
    pub revision: i64,
}

/// Orders gateways by the value of `path` in their JSON, as `--sort-by`
/// does: numbers by value, then text; a gateway without the field first.
/// A path that no gateway has is a mistake (as in kubectl).
pub fn sort(gateways: &mut [Gateway], path: &Path) -> Result<(), CtlError> {
    let key = |g: &Gateway| {
        let doc = serde_json::to_value(GatewayDoc::from_proto(g)).unwrap_or_default();
        let value = path.select(&doc).first().map(|v| (*v).clone());
        (
            value.as_ref().and_then(serde_json::Value::as_f64),
            value.as_ref().map(crate::template::text),
        )
    };
    let mut keyed: Vec<_> = gateways.iter().map(|g| (key(g), g.clone())).collect();
    if !keyed.is_empty() && keyed.iter().all(|((_, text), _)| text.is_none()) {
        return Err(CtlError::Message(format!(
            "couldn't find any field with path {path} in the list of objects: --sort-by takes a \
             JSONPath of the printed gateway, such as .metadata.name or .spec.image"
        )));
    }
    keyed.sort_by(|(a, _), (b, _)| {
        a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal).then_with(|| a.1.cmp(&b.1))
    });
    for (slot, (_, g)) in gateways.iter_mut().zip(keyed) {
        *slot = g;
    }
    Ok(())
}

/// `5s`, `3m`, `2h`, `4d` since a timestamp.
pub fn age(created: Option<&prost_types::Timestamp>, now: SystemTime) -> String {
    let Some(created) = created else { return "<unknown>".into() };
    let now_secs = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let secs = now_secs.saturating_sub(u64::try_from(created.seconds).unwrap_or(0));
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn ready(g: &Gateway) -> &'static str {
    let status = g.status.as_ref();
    match status.and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready")).map(|c| c.status())
    {
        Some(ConditionStatus::True) => "True",
        Some(ConditionStatus::False) => "False",
        _ => "Unknown",
    }
}

fn phase(g: &Gateway) -> String {
    g.status
        .as_ref()
        .map_or(Phase::Unspecified, |s| s.phase())
        .as_str_name()
        .trim_start_matches("PHASE_")
        .to_string()
}

/// Prints gateways in `format`.
pub fn print(
    gateways: &[Gateway],
    format: &Format,
    options: &PrintOptions,
    out: &mut impl Write,
) -> Result<(), CtlError> {
    let mut sorted;
    let gateways = match &options.sort_by {
        Some(path) => {
            sorted = gateways.to_vec();
            sort(&mut sorted, path)?;
            &sorted[..]
        }
        None => gateways,
    };
    let now = SystemTime::now();
    let docs = || gateways.iter().map(GatewayDoc::from_proto).collect::<Vec<_>>();
    let json = |docs: &[GatewayDoc]| -> serde_json::Value {
        if options.single {
            serde_json::to_value(&docs[0]).unwrap_or_default()
        } else {
            serde_json::json!({
                "apiVersion": manifest::API_VERSION,
                "kind": manifest::LIST_KINDS[0],
                "metadata": {"resourceVersion": options.revision},
                "items": docs,
            })
        }
    };
    let to_text = |e: serde_json::Error| CtlError::Message(e.to_string());
    match format {
        Format::Name => {
            for g in gateways {
                writeln!(out, "gateway/{}", g.metadata.as_ref().map_or("", |m| m.name.as_str()))?;
            }
        }
        Format::Json => {
            writeln!(out, "{}", serde_json::to_string_pretty(&json(&docs())).map_err(to_text)?)?;
        }
        Format::Yaml => {
            // A list is one GatewayList document (empty or not), as
            // `kubectl get -o yaml` prints a List.
            let text = serde_saphyr::to_string(&json(&docs()))
                .map_err(|e| CtlError::Message(e.to_string()))?;
            writeln!(out, "{}", text.trim_end())?;
        }
        Format::JsonPath(template) => write!(out, "{}", template.render(&json(&docs())))?,
        Format::Table | Format::Wide | Format::CustomColumns(_) => {
            let mut rows = vec![header(format)];
            for g in gateways {
                rows.push(row(g, format, now));
            }
            if options.show_labels {
                rows[0].push("LABELS".into());
                for (row, g) in rows[1..].iter_mut().zip(gateways) {
                    let labels = g.metadata.as_ref().map(|m| &m.labels);
                    let text = labels.filter(|l| !l.is_empty()).map_or("<none>".into(), |l| {
                        l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
                    });
                    row.push(text);
                }
            }
            table(rows, options.headers && format.is_table(), out)?;
        }
    }
    Ok(())
}

fn header(format: &Format) -> Vec<String> {
    let mut header: Vec<String> = match format {
        Format::CustomColumns(columns) => return columns.iter().map(|(h, _)| h.clone()).collect(),
        _ => ["NAME", "PHASE", "READY", "GENERATION", "OBSERVED", "AGE"].map(String::from).to_vec(),
    };
    if *format == Format::Wide {
        header.extend(["IMAGE", "ROUTE", "MESSAGE"].map(String::from));
    }
    header
}

fn row(g: &Gateway, format: &Format, now: SystemTime) -> Vec<String> {
    if let Format::CustomColumns(columns) = format {
        let doc = serde_json::to_value(GatewayDoc::from_proto(g)).unwrap_or_default();
        return columns
            .iter()
            .map(|(_, path)| {
                let values: Vec<String> =
                    path.select(&doc).into_iter().map(crate::template::text).collect();
                if values.is_empty() {
                    "<none>".into()
                } else {
                    values.join(",")
                }
            })
            .collect();
    }
    let meta = g.metadata.clone().unwrap_or_default();
    let spec = g.spec.clone().unwrap_or_default();
    let status = g.status.clone().unwrap_or_default();
    let mut row = vec![
        meta.name.clone(),
        phase(g),
        ready(g).into(),
        meta.generation.to_string(),
        status.observed_generation.to_string(),
        age(meta.create_time.as_ref(), now),
    ];
    if *format == Format::Wide {
        row.push(spec.image.clone());
        row.push(
            spec.route.map(|r| r.host).filter(|h| !h.is_empty()).unwrap_or_else(|| "<none>".into()),
        );
        row.push(status.message.clone());
    }
    row
}

/// Aligned columns, three spaces apart; the header row first when asked.
fn table(rows: Vec<Vec<String>>, headers: bool, out: &mut impl Write) -> Result<(), CtlError> {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .skip(usize::from(!headers))
        .map(|r| r.iter().map(|c| shown(c)).collect())
        .collect();
    let Some(first) = rows.first() else { return Ok(()) };
    let columns = first.len();
    let widths: Vec<usize> =
        (0..columns).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i + 1 == columns {
                    cell.clone()
                } else {
                    format!("{cell:<width$}", width = widths[i])
                }
            })
            .collect();
        writeln!(out, "{}", cells.join("   ").trim_end())?;
    }
    Ok(())
}

/// The `describe` text.
pub fn describe(g: &Gateway, out: &mut impl Write) -> Result<(), CtlError> {
    let doc = GatewayDoc::from_proto(g);
    let meta = &doc.metadata;
    writeln!(out, "Name:          {}", shown(&meta.name))?;
    writeln!(out, "UID:           {}", shown(&meta.uid))?;
    writeln!(out, "Created:       {}", meta.create_time)?;
    if !meta.delete_time.is_empty() {
        writeln!(out, "Deleting since: {}", meta.delete_time)?;
    }
    writeln!(out, "Generation:    {}", meta.generation)?;
    writeln!(out, "Labels:        {}", shown(&kv(&meta.labels)))?;
    writeln!(out, "Annotations:   {}", shown(&kv(&meta.annotations)))?;
    writeln!(
        out,
        "Finalizers:    {}",
        if meta.finalizers.is_empty() {
            "<none>".into()
        } else {
            shown(&meta.finalizers.join(", "))
        }
    )?;
    writeln!(out, "Spec:")?;
    let spec = serde_saphyr::to_string(&doc.spec).map_err(|e| CtlError::Message(e.to_string()))?;
    for line in spec.lines() {
        writeln!(out, "  {}", shown(line))?;
    }
    let status = doc.status.unwrap_or_default();
    writeln!(out, "Status:")?;
    writeln!(out, "  Phase:               {}", status.phase)?;
    writeln!(out, "  Observed generation: {}", status.observed_generation)?;
    if !status.route_address.is_empty() {
        writeln!(out, "  Route address:       {}", shown(&status.route_address))?;
    }
    if status.failure_count > 0 {
        writeln!(
            out,
            "  Failures:            {} (next retry {})",
            status.failure_count, status.next_retry_time
        )?;
    }
    if !status.message.is_empty() {
        writeln!(out, "  Message:             {}", shown(&status.message))?;
    }
    writeln!(out, "Conditions:")?;
    writeln!(out, "  {:<12} {:<8} {:<26} MESSAGE", "TYPE", "STATUS", "REASON")?;
    for c in &status.conditions {
        writeln!(
            out,
            "  {:<12} {:<8} {:<26} {}",
            shown(&c.kind),
            c.status,
            shown(&c.reason),
            shown(&c.message)
        )?;
    }
    writeln!(out, "Provisioning:")?;
    for s in &status.provisioning {
        writeln!(out, "  {:<20} {:<12} {}", shown(&s.name), s.state, shown(&s.message))?;
    }
    Ok(())
}

/// Text from the store as it may be shown on a terminal: control
/// characters (escape sequences that rewrite the screen, line breaks that
/// forge lines) appear escaped, as `\u{1b}` and `\n`.
fn shown(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

fn kv(map: &std::collections::BTreeMap<String, String>) -> String {
    if map.is_empty() {
        "<none>".into()
    } else {
        map.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{Condition, GatewaySpec, GatewayStatus, ObjectMeta};
    use std::time::Duration;

    fn gateway() -> Gateway {
        Gateway {
            metadata: Some(ObjectMeta {
                name: "edge".into(),
                generation: 2,
                create_time: Some(prost_types::Timestamp { seconds: 1000, nanos: 0 }),
                ..Default::default()
            }),
            spec: Some(GatewaySpec { image: "gw:1".into(), ..Default::default() }),
            status: Some(GatewayStatus {
                phase: Phase::Running as i32,
                observed_generation: 2,
                conditions: vec![Condition {
                    r#type: "Ready".into(),
                    status: ConditionStatus::True as i32,
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    fn render(format: Format) -> String {
        let mut out = Vec::new();
        let options = PrintOptions { headers: true, revision: 12, ..Default::default() };
        print(&[gateway()], &format, &options, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn text_from_the_store_cannot_forge_the_output() {
        let mut g = gateway();
        let evil = "x\u{1b}[2J\nName:          forged".to_string();
        g.metadata.as_mut().unwrap().annotations.insert("note".into(), evil.clone());
        g.spec.as_mut().unwrap().config.insert("k".into(), evil.clone());
        let mut out = Vec::new();
        describe(&g, &mut out).unwrap();
        let mut table = Vec::new();
        g.status.as_mut().unwrap().message = evil;
        let options = PrintOptions { headers: true, revision: 12, ..Default::default() };
        print(&[g], &Format::Wide, &options, &mut table).unwrap();
        for text in [out, table] {
            let text = String::from_utf8(text).unwrap();
            assert!(!text.contains('\u{1b}'), "{text}");
            assert!(!text.lines().any(|l| l.starts_with("Name:          forged")), "{text}");
        }
    }

    #[test]
    fn every_format() {
        let table = render(Format::Table);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("NAME")
                && lines[0].contains("OBSERVED")
                && lines[0].ends_with("AGE"),
            "{table}"
        );
        assert!(
            lines[1].starts_with("edge")
                && lines[1].contains("RUNNING")
                && lines[1].contains("True"),
            "{table}"
        );
        assert!(render(Format::Wide).lines().next().unwrap().ends_with("MESSAGE"));
        assert_eq!(render(Format::Name), "gateway/edge\n");
        let json: serde_json::Value = serde_json::from_str(&render(Format::Json)).unwrap();
        assert_eq!(json["items"][0]["status"]["phase"], "RUNNING");
        assert_eq!(json["metadata"]["resourceVersion"], 12);
        assert!(render(Format::Yaml).contains("name: edge"));
        let mut empty = Vec::new();
        let options = PrintOptions { revision: 12, ..Default::default() };
        print(&[], &Format::Yaml, &options, &mut empty).unwrap();
        let empty = String::from_utf8(empty).unwrap();
        let parsed: serde_json::Value = serde_saphyr::from_str(&empty).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({"apiVersion": "gantry.dev/v1", "kind": "GatewayList",
                "metadata": {"resourceVersion": 12}, "items": []}),
            "{empty}"
        );
    }

    #[test]
    fn ages() {
        let t = |s: i64| prost_types::Timestamp { seconds: s, nanos: 0 };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
        assert_eq!(age(Some(&t(99_990)), now), "10s");
        assert_eq!(age(Some(&t(99_000)), now), "16m");
        assert_eq!(age(Some(&t(90_000)), now), "2h");
        assert_eq!(age(Some(&t(0)), now), "27h");
        assert_eq!(age(None, now), "<unknown>");
    }
}
