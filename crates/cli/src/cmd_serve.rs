//! `vmscope serve`: `/metrics` in the Prometheus exposition format (see
//! `vmscope_stat::metrics`).
//!
//! The server is a small blocking `std::net` loop on purpose: it answers one
//! GET at a time (a scraper every few seconds), needs no async runtime, and
//! samples the host when scraped, so counters are exact at scrape time and
//! nothing runs between scrapes.

use anyhow::{Context, Result};
use clap::Args;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;
use vmscope_stat::account::{AccountOptions, Accountant};
use vmscope_stat::metrics::Totals;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: String,
    /// Also export per-host-CPU series.
    #[arg(long)]
    per_cpu: bool,
    /// A process whose CPU is shared I/O work for all VMs (repeatable).
    #[arg(long = "shared-io", value_name = "PID", value_parser = crate::args::pid,
          allow_negative_numbers = true)]
    shared_io: Vec<u32>,
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    crate::args::check_pids("--shared-io", &a.shared_io)?;
    // Ctrl-C, SIGTERM (systemctl stop) and SIGHUP end it with exit code 0.
    crate::signals::exit_on_stop("vmscope serve");
    let listener =
        TcpListener::bind(&a.listen).with_context(|| format!("listening on {}", a.listen))?;
    eprintln!(
        "vmscope serve: http://{}/metrics",
        listener.local_addr().context("local address")?
    );
    let mut acc = Accountant::new(AccountOptions {
        shared_io_pids: a.shared_io,
        ..AccountOptions::default()
    });
    acc.sample().context("first sample")?;
    let mut totals = Totals::new(a.per_cpu);
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        if let Err(e) = handle(stream, &mut acc, &mut totals) {
            eprintln!("vmscope serve: {e:#}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn handle(mut stream: TcpStream, acc: &mut Accountant, totals: &mut Totals) -> Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // Skip the headers.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let path = request.split_whitespace().nth(1).unwrap_or("");
    let (status, ctype, body) = if request.starts_with("GET ") && path.starts_with("/metrics") {
        if let (Some(iv), _) = acc.sample().context("sampling")? {
            totals.add(&iv);
        }
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            totals.encode(),
        )
    } else if request.starts_with("GET ") && path == "/" {
        (
            "200 OK",
            "text/plain",
            "vmscope serve: see /metrics\n".to_string(),
        )
    } else {
        ("404 Not Found", "text/plain", "not found\n".to_string())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()?;
    Ok(())
}
