//! The page `serve --history` answers at `/`: a self-contained web page
//! (no external assets; behind the same TLS and authentication as every
//! endpoint) with a timeline of the host's and each VM's CPU, steal and
//! I/O CPU over the whole history, a range picked on it (drag across a
//! timeline, or `?from=..&to=..` in the URL, each a time as
//! `top --replay --at` takes it or seconds since the epoch), and below it
//! the report of that range in a frame: `/report?from=..&to=..`, which is
//! `report DIR --time FROM-TO --format html` (the range extracted by
//! `vmscope_history::History::extract`, the page written by
//! `vmscope_report::html::write`): the host's and each VM's flame graph
//! and top functions for those seconds.

use std::fmt::Write as _;
use vmscope_history::{time, History};

/// Points of a timeline across the page's width.
const POINTS: usize = 480;
/// The range shown when the URL names none: the history's last minutes.
const DEFAULT_RANGE: f64 = 300.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `from` and `to` of a query (percent-decoded), each parsed as a time.
fn range(query: &str, span: (f64, f64)) -> Result<(f64, f64), String> {
    let mut from = None;
    let mut to = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v);
        let parse = |v: &str| -> Result<f64, String> {
            match v.parse::<f64>() {
                Ok(t) if t > 1e9 => Ok(t),
                _ => time::parse(v, time::now(), false).map_err(|e| format!("{k}={v}: {e}")),
            }
        };
        match k {
            "from" => from = Some(parse(&v)?),
            "to" => to = Some(parse(&v)?),
            _ => {}
        }
    }
    let to = to.unwrap_or(span.1).min(span.1);
    let from = from.unwrap_or(to - DEFAULT_RANGE).max(span.0);
    if to <= from {
        return Err(format!(
            "the range {} to {} holds none of the history ({} to {})",
            time::show(from, false),
            time::show(to, false),
            time::show(span.0, false),
            time::show(span.1, false)
        ));
    }
    Ok((from, to))
}

/// Percent-decoding of a query value (`+` is a space).
fn decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(x) => {
                        out.push(x);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The page at `/`: `Err((status, text))` for a bad range.
pub fn page(h: &mut History, query: &str) -> Result<String, (u16, String)> {
    h.refresh().map_err(|e| (500, e.to_string()))?;
    let Some(span) = h.span() else {
        return Ok("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>vmscope</title></head>\
             <body><h1>vmscope serve</h1><p>The history holds no intervals yet: come back in a second.</p></body></html>"
            .to_string());
    };
    let (from, to) = range(query, span).map_err(|e| (400, e))?;
    // One bucket per point across the whole history.
    let bucket = ((span.1 - span.0) / POINTS as f64).max(1.0);
    let rows = h
        .timeline(span.0, span.1, bucket)
        .map_err(|e| (500, e.to_string()))?;
    let mut per: std::collections::BTreeMap<String, Vec<&vmscope_store::TimelineRow>> =
        Default::default();
    for r in &rows {
        per.entry(r.domain.clone()).or_default().push(r);
    }
    let mut names: Vec<String> = per.keys().filter(|n| *n != "host").cloned().collect();
    names.sort();
    if per.contains_key("host") {
        names.insert(0, "host".into());
    }
    let (w, ht) = (960.0, 64.0);
    let x = |t: f64| ((t - span.0) / (span.1 - span.0).max(1e-9) * w).clamp(0.0, w);
    let mut body = String::new();
    let _ = write!(
        body,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"generator\" content=\"vmscope\">\
         <title>vmscope history</title><style>{STYLE}</style></head><body>\
         <h1>vmscope history</h1><p>The history holds {} to {}. Drag across a timeline to pick a range; \
         shown: <b id=\"range\">{} to {}</b> (<a href=\"/?from={}&amp;to={}\">the last 5 minutes</a>, \
         <a href=\"/?from={}&amp;to={}\">all of it</a>).</p>\
         <p class=\"key\"><span style=\"color:#1f77b4\">CPU %</span> <span style=\"color:#d62728\">steal %</span> \
         <span style=\"color:#2ca02c\">I/O CPU %</span> (of one host CPU; steal summed over vCPUs)</p>",
        esc(&time::show(span.0, false)),
        esc(&time::show(span.1, false)),
        esc(&time::show(from, false)),
        esc(&time::show(to, false)),
        (span.1 - DEFAULT_RANGE).max(span.0),
        span.1,
        span.0,
        span.1
    );
    for name in &names {
        let rs = &per[name];
        let pct = |v: f64, r: &vmscope_store::TimelineRow| 100.0 * v / r.interval_s.max(1e-9);
        let top = rs
            .iter()
            .map(|r| pct(r.cpu_s, r).max(pct(r.steal_s, r)))
            .fold(100.0_f64, f64::max);
        let y = |v: f64| ht - v / top * (ht - 4.0);
        let line = |f: &dyn Fn(&vmscope_store::TimelineRow) -> f64| {
            let mut s = String::new();
            for r in rs.iter() {
                let _ = write!(s, "{:.1},{:.1} ", x(r.t_end - r.interval_s / 2.0), y(f(r)));
            }
            s
        };
        let _ = write!(
            body,
            "<div class=\"vm\" data-domain=\"{n}\"><h2>{n} <small>peak {top:.0} %</small></h2>\
             <svg class=\"tl\" viewBox=\"0 0 {w} {ht}\" width=\"{w}\" height=\"{ht}\" data-from=\"{a}\" data-to=\"{b}\">\
             <rect x=\"{sx:.1}\" y=\"0\" width=\"{sw:.1}\" height=\"{ht}\" class=\"sel\"/>\
             <polyline class=\"cpu\" points=\"{cpu}\"/><polyline class=\"steal\" points=\"{steal}\"/>\
             <polyline class=\"io\" points=\"{io}\"/></svg></div>",
            n = esc(name),
            a = span.0,
            b = span.1,
            sx = x(from),
            sw = (x(to) - x(from)).max(1.0),
            cpu = line(&|r| pct(r.cpu_s, r)),
            steal = line(&|r| pct(r.steal_s, r)),
            io = line(&|r| pct(r.io_s, r)),
        );
    }
    let _ = write!(
        body,
        "<h2>{} to {}</h2><iframe id=\"report\" title=\"report of the range\" src=\"/report?from={from:.3}&amp;to={to:.3}\"></iframe>\
         <script>{SCRIPT}</script></body></html>",
        esc(&time::show(from, false)),
        esc(&time::show(to, false)),
    );
    Ok(body)
}

/// `/report?from=..&to=..`: the HTML report of the range.
pub fn report(h: &mut History, query: &str) -> Result<Vec<u8>, (u16, String)> {
    h.refresh().map_err(|e| (500, e.to_string()))?;
    let Some(span) = h.span() else {
        return Err((404, "the history holds no intervals yet".into()));
    };
    let (from, to) = range(query, span).map_err(|e| (400, e))?;
    let dir = tempfile::tempdir().map_err(|e| (500, format!("a temporary directory: {e}")))?;
    let path = dir.path().join("range.db");
    h.extract(from, to, &path)
        .map_err(|e| (500, format!("extracting the range: {e}")))?;
    let session = vmscope_store::Session::open(&path)
        .map_err(|e| (500, format!("reading the range: {e}")))?
        .shown_as(std::path::Path::new(&format!(
            "the history from {} to {}",
            time::show(from, false),
            time::show(to, false)
        )));
    let mut out = Vec::new();
    vmscope_report::html::write(
        &session,
        &vmscope_report::ReportOptions::default(),
        &mut out,
    )
    .map_err(|e| (500, format!("the report of the range: {e}")))?;
    Ok(out)
}

const STYLE: &str = "body{font-family:sans-serif;margin:1em 2em;color:#222}\
h2{font-size:1em;margin:.6em 0 .2em}small{color:#777;font-weight:normal}\
svg.tl{border:1px solid #ccc;cursor:crosshair;display:block}\
polyline{fill:none;stroke-width:1.2}.cpu{stroke:#1f77b4}.steal{stroke:#d62728}.io{stroke:#2ca02c}\
rect.sel{fill:#ffd54f;opacity:.35}\
iframe{width:100%;height:80vh;border:1px solid #ccc}";

/// Dragging across a timeline picks a range: the page reloads with it.
const SCRIPT: &str = "document.querySelectorAll('svg.tl').forEach(function(s){\
var a=null;function t(e){var r=s.getBoundingClientRect();var f=Math.min(1,Math.max(0,(e.clientX-r.left)/r.width));\
var x=+s.dataset.from,y=+s.dataset.to;return x+f*(y-x);}\
s.addEventListener('mousedown',function(e){a=t(e);e.preventDefault();});\
s.addEventListener('mouseup',function(e){if(a===null)return;var b=t(e);var lo=Math.min(a,b),hi=Math.max(a,b);a=null;\
if(hi-lo<1){lo-=30;hi+=30;}location.search='?from='+lo.toFixed(3)+'&to='+hi.toFixed(3);});});";

#[cfg(test)]
mod tests {
    #[test]
    fn query_values_are_decoded() {
        assert_eq!(super::decode("yesterday+03%3A05"), "yesterday 03:05");
        assert_eq!(super::decode("100%"), "100%");
    }
}
