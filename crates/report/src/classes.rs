//! Function classes (`report --by class`): groups of functions as menon2005
//! and santos2006 show them (netback, bridge, net/core, netfilter, mm, …).
//!
//! A row's class is the first match of: the user's rules (`--classes
//! FILE`, TOML), the built-in rules (kernel subsystems, KVM, virtio, vhost,
//! QEMU's device models and its TCG translator), the kernel subsystem from
//! the source path where DWARF gave one (`net/core/dev.c` → `net/core`), the
//! kernel module (`[e1000e]` → `e1000e`), else the binary's file name.
//!
//! Rules file:
//!
//! ```toml
//! # first matching rule wins; the user's rules come before the built-in ones
//! builtin = true                      # false: only these rules
//! [[rule]]
//! class = "netback"
//! symbol = "^(netbk|xenvif)_"         # regex on the function name
//! image = "xen.netback"               # regex on the image (path or [module])
//! source = "drivers/net/xen-netback/" # regex on the source file (DWARF)
//! context = ["guest-kernel"]          # contexts it applies to (default: all)
//! ```
//!
//! Errors name the file, line and column of the offending value.

use regex::Regex;
use serde::Deserialize;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use toml::Spanned;
use vmscope_model::Context;

/// A rules file that cannot be used: where and why.
#[derive(Debug)]
pub struct ClassError {
    pub path: PathBuf,
    /// 1-based line of the offending text; 0 when the file could not be read.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for ClassError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.path.display(), self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.path.display(),
                self.line,
                self.column,
                self.message
            )
        }
    }
}

impl std::error::Error for ClassError {}

/// One rule: every given pattern must match.
#[derive(Debug, Clone)]
pub struct Rule {
    pub class: String,
    symbol: Option<Regex>,
    image: Option<Regex>,
    source: Option<Regex>,
    /// Empty: every context.
    contexts: Vec<Context>,
}

impl Rule {
    fn new(class: &str, contexts: &[Context], symbol: Option<&str>, image: Option<&str>) -> Rule {
        let re = |p: &str| Regex::new(p).expect("built-in class pattern");
        Rule {
            class: class.into(),
            symbol: symbol.map(re),
            image: image.map(re),
            source: None,
            contexts: contexts.to_vec(),
        }
    }

    fn matches(&self, ctx: Option<Context>, image: &str, symbol: &str, srcline: &str) -> bool {
        if !self.contexts.is_empty() && !ctx.is_some_and(|c| self.contexts.contains(&c)) {
            return false;
        }
        let source = srcline.rsplit_once(':').map_or(srcline, |(f, _)| f);
        self.symbol.as_ref().is_none_or(|r| r.is_match(symbol))
            && self.image.as_ref().is_none_or(|r| r.is_match(image))
            && self
                .source
                .as_ref()
                .is_none_or(|r| !source.is_empty() && r.is_match(source))
    }
}

/// The rules in force.
#[derive(Debug, Clone)]
pub struct Classes {
    rules: Vec<Rule>,
    /// Where the user's rules came from (for the report header).
    pub source: Option<PathBuf>,
}

impl Default for Classes {
    fn default() -> Classes {
        Classes::builtin()
    }
}

const KERNEL: &[Context] = &[
    Context::HostKernel,
    Context::VmmKernel,
    Context::GuestKernel,
];
const VMM_USER: &[Context] = &[Context::VmmUser];

/// The built-in rules, in order (first match wins).
fn builtin_rules() -> Vec<Rule> {
    let k = KERNEL;
    vec![
        Rule::new(
            "translated guest code",
            &[Context::GuestTranslated],
            None,
            None,
        ),
        Rule::new(
            "idle",
            &[Context::Idle, Context::HostKernel, Context::GuestKernel],
            Some(
                r"^(default_idle|native_safe_halt|cpu_idle|do_idle|mwait_idle|intel_idle|acpi_idle|cpuidle_|poll_idle|arch_cpu_idle|pv_native_safe_halt|default_idle_call)",
            ),
            None,
        ),
        Rule::new("vhost", k, None, Some(r"^\[(guest\.)?vhost")),
        Rule::new(
            "vhost",
            k,
            Some(r"^(vhost_|handle_(tx|rx)(_net|_kick)?$)"),
            None,
        ),
        Rule::new("kvm", k, None, Some(r"^\[(guest\.)?kvm(_intel|_amd)?\]$")),
        Rule::new(
            "kvm",
            k,
            Some(
                r"^(kvm_|__kvm_|vmx_|__vmx_|svm_|__svm_|vcpu_enter_guest|vcpu_run|handle_exit|x86_emulate|emulator_)",
            ),
            None,
        ),
        Rule::new("virtio", k, None, Some(r"^\[(guest\.)?virtio")),
        Rule::new(
            "virtio",
            k,
            Some(
                r"^(virtio|virtqueue_|vring_|vp_|virtnet_|virtblk_|vm_notify|detach_buf|free_old_xmit)",
            ),
            None,
        ),
        Rule::new("bridge", k, None, Some(r"^\[(guest\.)?bridge\]$")),
        Rule::new("bridge", k, Some(r"^(br_|__br_|fdb_)"), None),
        Rule::new(
            "netfilter",
            k,
            None,
            Some(r"^\[(guest\.)?(nf_|nft_|xt_|x_tables|ip_tables|ip6_tables|iptable_|ebt|ebtable)"),
        ),
        Rule::new(
            "netfilter",
            k,
            Some(
                r"^(nf_|__nf_|ipt_|ip6t_|nft_|__nft_|xt_|ebt_|iptable_|ip6table_|conntrack|ipv4_conntrack)",
            ),
            None,
        ),
        Rule::new(
            "net/ipv4",
            k,
            Some(r"^(tcp_|__tcp_|tcp4_|udp_|__udp|udp4_|ip_|__ip_|inet_|__inet_|icmp_|raw_|ping_)"),
            None,
        ),
        Rule::new(
            "net/ipv6",
            k,
            Some(r"^(ip6_|ipv6_|__ipv6|tcp_v6|udpv6|icmpv6|ndisc_|fib6_)"),
            None,
        ),
        Rule::new("ethernet", k, Some(r"^(eth_|ether_)"), None),
        Rule::new(
            "net/core",
            k,
            Some(
                r"^(__?netif_|netif_|net_rx_action|net_tx_action|__?dev_queue_xmit|dev_hard_start_xmit|dev_|__dev_|skb_|__skb_|kfree_skb|consume_skb|__kfree_skb|alloc_skb|__alloc_skb|build_skb|napi_|__napi_|gro_|dev_gro|sock_|__sock_|sk_|__sk_|release_sock|lock_sock|neigh_|__neigh_|dst_|sch_|__qdisc|qdisc_|pfifo_|fq_codel|validate_xmit|rps_|process_backlog|__netdev|netdev_|rtnl_|datagram_|csum_|__csum)",
            ),
            None,
        ),
        Rule::new(
            "block",
            k,
            Some(
                r"^(blk_|__blk_|bio_|__bio_|submit_bio|generic_make_request|elv_|dd_|bfq_|kyber_|scsi_|__scsi|sd_|nvme_|ata_|__ata|blkdev_|__blkdev|bdev_|mpage_|iomap_)",
            ),
            None,
        ),
        Rule::new(
            "sched",
            k,
            Some(
                r"^(schedule|__schedule|pick_next_task|put_prev_task|enqueue_task|dequeue_task|enqueue_entity|dequeue_entity|update_curr|update_load|update_rq|update_cfs|try_to_wake_up|wake_up|__wake_up|ttwu_|select_task_rq|check_preempt|finish_task_switch|context_switch|__switch_to|sched_|__sched|set_next_entity|load_balance|newidle_balance|idle_cpu|psi_|cpuacct_|account_|__update_load|reweight_entity|resched_|hrtick|task_tick)",
            ),
            None,
        ),
        Rule::new(
            "mm",
            k,
            Some(
                r"^(__?alloc_pages|alloc_pages|__?free_pages|free_pages|free_unref|free_pcp|get_page_from_freelist|rmqueue|__rmqueue|kmem_cache_|__kmem_cache|kmalloc|__kmalloc|kfree|krealloc|vmalloc|__vmalloc|vfree|clear_page|copy_page|handle_mm_fault|__handle_mm_fault|handle_pte_fault|do_anonymous_page|do_wp_page|wp_page_copy|do_fault|do_page_fault|exc_page_fault|asm_exc_page_fault|do_user_addr_fault|filemap_|page_|__page_|folio_|__folio_|lru_|__lru|mmap_|do_mmap|__do_munmap|unmap_|zap_|__pte|pte_|pmd_|follow_page|get_user_pages|__get_user_pages|memcg|mem_cgroup|__mem_cgroup|slab_|__slab_|___slab_|shrink_|vma_|__vma|anon_vma|rmap_|page_vma|mark_page|set_page|memset|memcpy|copy_user|__copy_user|copy_from_user|copy_to_user|_copy_from_user|_copy_to_user|rep_movs|clear_user|__clear_user)",
            ),
            None,
        ),
        Rule::new(
            "tcg",
            VMM_USER,
            Some(
                r"^(tb_|tcg_|gen_|translator_|cpu_exec|cpu_tb_exec|cpu_loop_exec|helper_|cpu_get_tb|tlb_|probe_access|get_page_addr_code|page_collection|disas_|i386_tr_|x86_ldub|x86_lduw|x86_ldl|x86_ldq|cpu_ld|cpu_st|do_ld|do_st|mmu_lookup|store_helper|load_helper|tcg_qemu_tb_exec|cpu_io_recompile|cpu_restore_state|restore_state_to_opc|cpu_loop_exit)",
            ),
            None,
        ),
        Rule::new(
            "qemu devices",
            VMM_USER,
            Some(
                r"^(virtio_|vhost_|vring_|e1000|pci_|msix_|msi_|memory_region_|address_space_|flatview_|blk_|bdrv_|ide_|ahci_|net_|qemu_net|qemu_send_packet|tap_|serial_|vga_|cirrus|apic_|ioapic_|pic_|hpet_|pit_|kvm_io|qemu_irq|qemu_set_irq|scsi_|usb_|fw_cfg|acpi_|rtc_|mc146818|portio_|ioport_|virtqueue_)",
            ),
            None,
        ),
        Rule::new(
            "qemu main loop",
            VMM_USER,
            Some(
                r"^(main_loop|qemu_main_loop|qemu_poll|aio_|qemu_coroutine|coroutine_|g_main|g_source|os_host_main_loop|qemu_mutex|qemu_cond|qemu_sem|qemu_event|qemu_thread|qemu_bh|timerlist_|qemu_clock|event_notifier|fdmon_|ppoll|glib_pollfd)",
            ),
            None,
        ),
    ]
}

/// Top-level directories of the Linux source tree (for subsystems from
/// DWARF source paths).
const KERNEL_DIRS: &[&str] = &[
    "arch", "block", "crypto", "drivers", "fs", "init", "io_uring", "ipc", "kernel", "lib", "mm",
    "net", "security", "sound", "virt",
];

/// `net/core` from `/build/linux/net/core/dev.c`, `mm` from `…/mm/slub.c`.
fn kernel_subsystem(srcline: &str) -> Option<String> {
    let file = srcline.rsplit_once(':').map_or(srcline, |(f, _)| f);
    let parts: Vec<&str> = file.split('/').filter(|p| !p.is_empty()).collect();
    // The last top-level kernel directory that still has a file under it.
    let i = parts
        .iter()
        .rposition(|p| KERNEL_DIRS.contains(p))
        .filter(|&i| i + 1 < parts.len())?;
    let rest = &parts[i + 1..];
    Some(if rest.len() >= 2 {
        format!("{}/{}", parts[i], rest[0])
    } else {
        parts[i].to_string()
    })
}

/// What an image falls back to: the module name or the binary's file name.
fn image_class(image: &str) -> Cow<'_, str> {
    match image {
        "[kernel.kallsyms]" | "[guest.kernel.kallsyms]" => Cow::Borrowed("kernel"),
        _ if image.starts_with("[guest.") && image.ends_with(']') => {
            Cow::Borrowed(&image[7..image.len() - 1])
        }
        _ if image.starts_with('[') && image.ends_with(']') => {
            Cow::Borrowed(&image[1..image.len() - 1])
        }
        _ => Cow::Borrowed(image.rsplit('/').next().unwrap_or(image)),
    }
}

/// The rules file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default = "yes")]
    builtin: bool,
    #[serde(default)]
    rule: Vec<RuleSpec>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    class: Spanned<String>,
    symbol: Option<Spanned<String>>,
    image: Option<Spanned<String>>,
    source: Option<Spanned<String>>,
    context: Option<Vec<Spanned<String>>>,
}

/// 1-based (line, column) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

impl Classes {
    /// The built-in rules only.
    pub fn builtin() -> Classes {
        Classes {
            rules: builtin_rules(),
            source: None,
        }
    }

    /// The user's rules from a TOML file, then (unless `builtin = false`)
    /// the built-in ones.
    pub fn from_file(path: &Path) -> Result<Classes, ClassError> {
        let text = vmscope_linux::files::read_input(path, vmscope_linux::files::INPUT_FILE)
            .map_err(|e| ClassError {
                path: path.into(),
                // The file was not read: no line or column to point at.
                line: 0,
                column: 0,
                message: format!("cannot read the class rules: {e}"),
            })?;
        Classes::parse(&text, path)
    }

    /// Parse rules text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Classes, ClassError> {
        let err = |offset: usize, message: String| {
            let (line, column) = line_col(text, offset);
            ClassError {
                path: path.into(),
                line,
                column,
                message,
            }
        };
        let file: RulesFile = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(0, |s| s.start);
            err(at, e.message().trim().to_string())
        })?;
        let mut rules = Vec::new();
        for spec in file.rule {
            let re =
                |field: &str, v: &Option<Spanned<String>>| -> Result<Option<Regex>, ClassError> {
                    match v {
                        None => Ok(None),
                        Some(s) => Regex::new(s.get_ref()).map(Some).map_err(|e| {
                            let first = e.to_string();
                            let first = first.lines().last().unwrap_or("").trim().to_string();
                            err(
                                s.span().start,
                                format!("'{field}' is not a valid regular expression: {first}"),
                            )
                        }),
                    }
                };
            if spec.class.get_ref().trim().is_empty() {
                return Err(err(spec.class.span().start, "'class' is empty".into()));
            }
            let mut contexts = Vec::new();
            for c in spec.context.iter().flatten() {
                match Context::parse(c.get_ref()) {
                    Some(ctx) => contexts.push(ctx),
                    None => {
                        return Err(err(
                            c.span().start,
                            format!(
                                "unknown context '{}'; contexts: {}",
                                c.get_ref(),
                                Context::ALL.map(Context::as_str).join(", ")
                            ),
                        ))
                    }
                }
            }
            let rule = Rule {
                class: spec.class.get_ref().trim().to_string(),
                symbol: re("symbol", &spec.symbol)?,
                image: re("image", &spec.image)?,
                source: re("source", &spec.source)?,
                contexts,
            };
            if rule.symbol.is_none() && rule.image.is_none() && rule.source.is_none() {
                return Err(err(
                    spec.class.span().start,
                    format!(
                        "rule for class '{}' has no 'symbol', 'image' or 'source' pattern",
                        rule.class
                    ),
                ));
            }
            rules.push(rule);
        }
        if file.builtin {
            rules.extend(builtin_rules());
        }
        Ok(Classes {
            rules,
            source: Some(path.into()),
        })
    }

    /// The class of a row.
    pub fn classify<'a>(
        &'a self,
        context: &str,
        image: &'a str,
        symbol: &str,
        srcline: &str,
    ) -> Cow<'a, str> {
        // `--by context` labels carry " (modules)".
        let ctx = Context::parse(context.split(' ').next().unwrap_or(context));
        if let Some(r) = self
            .rules
            .iter()
            .find(|r| r.matches(ctx, image, symbol, srcline))
        {
            return Cow::Borrowed(&r.class);
        }
        if ctx.is_some_and(|c| KERNEL.contains(&c)) && !srcline.is_empty() {
            if let Some(s) = kernel_subsystem(srcline) {
                return Cow::Owned(s);
            }
        }
        image_class(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_rules_and_fallbacks() {
        let c = Classes::builtin();
        let k = "guest-kernel";
        assert_eq!(
            c.classify(k, "[guest.kernel.kallsyms]", "br_handle_frame", ""),
            "bridge"
        );
        assert_eq!(
            c.classify(k, "[guest.kernel.kallsyms]", "nf_hook_slow", ""),
            "netfilter"
        );
        assert_eq!(
            c.classify(k, "[guest.kernel.kallsyms]", "net_rx_action", ""),
            "net/core"
        );
        assert_eq!(
            c.classify("host-kernel", "[kernel.kallsyms]", "__alloc_pages", ""),
            "mm"
        );
        assert_eq!(
            c.classify("vmm-kernel", "[kvm_intel]", "vmx_vcpu_run", ""),
            "kvm"
        );
        assert_eq!(
            c.classify("vmm-kernel", "[vhost_net]", "handle_rx", ""),
            "vhost"
        );
        assert_eq!(
            c.classify(k, "[guest.virtio_net]", "start_xmit", ""),
            "virtio"
        );
        assert_eq!(
            c.classify("vmm-user", "/usr/bin/qemu-system-x86_64", "tb_gen_code", ""),
            "tcg"
        );
        assert_eq!(
            c.classify(
                "vmm-user",
                "/usr/bin/qemu-system-x86_64",
                "virtio_blk_handle_output",
                ""
            ),
            "qemu devices"
        );
        assert_eq!(
            c.classify("host-kernel", "[kernel.kallsyms]", "__schedule", ""),
            "sched"
        );
        assert_eq!(
            c.classify("host-kernel", "[kernel.kallsyms]", "blk_mq_submit_bio", ""),
            "block"
        );
        // Fallbacks: DWARF source path, module, binary.
        assert_eq!(
            c.classify(
                "host-kernel",
                "[kernel.kallsyms]",
                "foo",
                "/build/linux/net/sched/cls_api.c:12"
            ),
            "net/sched"
        );
        assert_eq!(
            c.classify("host-kernel", "[kernel.kallsyms]", "foo", "/src/mm/x.c:1"),
            "mm"
        );
        assert_eq!(
            c.classify("host-kernel", "[e1000e]", "e1000_clean", ""),
            "e1000e"
        );
        assert_eq!(c.classify(k, "[guest.e1000]", "e1000_intr", ""), "e1000");
        assert_eq!(c.classify("host-user", "/usr/bin/make", "main", ""), "make");
        assert_eq!(
            c.classify("host-kernel (modules)", "[e1000e]", "x", ""),
            "e1000e"
        );
        // User code is never a kernel subsystem by name alone.
        assert_eq!(
            c.classify("host-user", "/usr/bin/app", "tcp_connect_helper", ""),
            "app"
        );
    }

    #[test]
    fn user_rules_come_first_and_errors_have_line_and_column() {
        let text =
            "[[rule]]\nclass = \"netback\"\nsymbol = \"^netbk_\"\ncontext = [\"guest-kernel\"]\n";
        let c = Classes::parse(text, Path::new("c.toml")).unwrap();
        assert_eq!(
            c.classify("guest-kernel", "[guest.kernel.kallsyms]", "netbk_rx", ""),
            "netback"
        );
        assert_eq!(
            c.classify("host-kernel", "[kernel.kallsyms]", "netbk_rx", ""),
            "kernel"
        );
        assert_eq!(
            c.classify("host-kernel", "[kernel.kallsyms]", "br_forward", ""),
            "bridge"
        );

        let bad_re = "[[rule]]\nclass = \"x\"\nsymbol = \"^(unclosed\"\n";
        let e = Classes::parse(bad_re, Path::new("c.toml")).err().unwrap();
        assert_eq!((e.line, e.column), (3, 10), "{e}");
        assert!(
            e.to_string()
                .starts_with("c.toml:3:10: 'symbol' is not a valid regular expression"),
            "{e}"
        );

        let bad_key = "[[rule]]\nclass = \"x\"\nsymbl = \"a\"\n";
        let e = Classes::parse(bad_key, Path::new("c.toml")).err().unwrap();
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("symbl"), "{e}");

        let bad_ctx =
            "[[rule]]\nclass = \"x\"\nsymbol = \"a\"\ncontext = [\"guest-kernel\", \"kernal\"]\n";
        let e = Classes::parse(bad_ctx, Path::new("c.toml")).err().unwrap();
        assert_eq!((e.line, e.column), (4, 28), "{e}");
        assert!(e.message.contains("unknown context 'kernal'"), "{e}");

        let syntax = "[[rule]]\nclass = \"x\nsymbol = \"a\"\n";
        let e = Classes::parse(syntax, Path::new("c.toml")).err().unwrap();
        assert_eq!(e.line, 2, "{e}");

        let empty = "[[rule]]\nclass = \"x\"\n";
        let e = Classes::parse(empty, Path::new("c.toml")).err().unwrap();
        assert!(
            e.message.contains("no 'symbol', 'image' or 'source'"),
            "{e}"
        );
        assert_eq!((e.line, e.column), (2, 9), "{e}");
    }
}
