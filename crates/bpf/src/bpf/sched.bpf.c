// SPDX-License-Identifier: MIT OR GPL-2.0
//
// vmscope's scheduler programs, built by crates/bpf/build.rs with clang
// (-target bpf) and embedded in the vmscope binary; loaded with libbpf,
// which relocates the kernel structure fields below (CO-RE) against the
// running kernel's BTF. Both run on the BTF raw tracepoint of
// sched_switch (tp_btf): unlike a program on the tracepoint's perf event,
// they never decide whether perf readers of the tracepoint get the record.
//
// switch_times (vm-stat): each (CPU, tid)'s run time, summed per closed
// slice into `acc`, the running slice in `cur` (CLOCK_MONOTONIC ns, so
// that the reader cuts slices at its interval boundaries).
//
// switch_waits and migrate_waits (who a thread waited behind): the time a
// followed thread was runnable but not running, split by what ran on the
// CPU it waited on, summed per (waiter, culprit) into `waits`. The times
// are the kernel's own: a wait starts at the task's `sched_info.last_queued`
// (the runqueue clock when it was queued) and ends at the runqueue clock
// of the switch that runs it (`rq->clock`, what sched_info_arrive adds to
// `run_delay`), so each thread's split adds up to its `run_delay`. What ran
// on a CPU comes from that CPU's log of its last LOG_LEN switches.
// A waiting task that the load balancer moves is dequeued first: the
// kernel adds the wait so far to `run_delay` and clears `last_queued`, so
// migrate_waits charges the growth of `run_delay` since the thread was
// last seen, ending at the old runqueue's clock.

#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#define COMM_LEN 16
#define LOG_LEN 256
#define LOG_MASK (LOG_LEN - 1)
// Segments looked at for one wait: the rest of a wait that saw more
// switches on its CPU is charged to OTHER (and counted). Each segment is
// a map update: this bounds what one switch costs when many threads wait
// on one CPU (500 threads waking every 20 ms on 2 CPUs: 0.96 us a switch with 1 segment, 1.5 us with 16, 1.9 us with 128, by bpf_stats here).
#define MAX_WALK 8
// Distinct culprits kept per waiter between two drains (as the tracepoint
// timeline's MAX_CULPRITS); the rest go to OTHER.
#define MAX_CULPRITS 64

// The kernel's structures, only the fields read (relocated by libbpf).
struct sched_info {
	unsigned long long run_delay;
	unsigned long long last_queued;
} __attribute__((preserve_access_index));

struct rq;

struct cfs_rq {
	struct rq *rq; // with CONFIG_FAIR_GROUP_SCHED
} __attribute__((preserve_access_index));

struct task_struct;

struct rq {
	__u64 clock;
	int cpu;
	struct task_struct *curr;
	struct cfs_rq cfs;
} __attribute__((preserve_access_index));

struct sched_entity {
	struct cfs_rq *cfs_rq;
} __attribute__((preserve_access_index));

struct thread_info {
	unsigned int cpu;
} __attribute__((preserve_access_index));

struct task_struct {
	struct thread_info thread_info;
	unsigned int cpu;
	int on_rq;
	int pid;
	char comm[COMM_LEN];
	struct sched_entity se;
	struct sched_info sched_info;
} __attribute__((preserve_access_index));

// The runqueue task `p` is on, reached through its CFS runqueue
// (`runqueues` itself is not in kallsyms without CONFIG_KALLSYMS_ALL, so
// it cannot be a typed ksym everywhere): the `rq` back pointer with group
// scheduling (plain loads of BTF pointers), else the runqueue that embeds
// it.
static __always_inline struct rq *rq_of(struct task_struct *p)
{
	// Both exist only with CONFIG_FAIR_GROUP_SCHED; without it the
	// programs cannot reach the runqueue and count every event they skip
	// (ST_NO_RQ), which user space says.
	if (!bpf_core_field_exists(p->se.cfs_rq))
		return 0;
	struct cfs_rq *cfs = p->se.cfs_rq;
	return cfs->rq;
}

// task_cpu(): in thread_info where the kernel keeps it there.
static __always_inline __u32 task_cpu_of(struct task_struct *p)
{
	if (bpf_core_field_exists(p->thread_info.cpu))
		return BPF_CORE_READ(p, thread_info.cpu);
	return BPF_CORE_READ(p, cpu);
}

// rq_clock() of `rq` (what sched_info adds to run_delay) and its CPU (-1
// without a runqueue).
static __always_inline __u64 rq_clock_of(struct rq *rq, int *cpu)
{
	__u64 clock = 0;
	*cpu = -1;
	if (!rq)
		return 0;
	bpf_probe_read_kernel(&clock, sizeof(clock), __builtin_preserve_access_index(&rq->clock));
	bpf_probe_read_kernel(cpu, sizeof(*cpu), __builtin_preserve_access_index(&rq->cpu));
	return clock;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// ---- vm-stat: run time per (CPU, tid) ----

struct running {
	__u64 since; // CLOCK_MONOTONIC ns the running slice began (0: none seen)
	__u32 tid;
	__u32 pad;
	__u64 unchained; // switches whose prev was not the task switched in
	__u64 dropped;   // slices lost because `acc` was full
};

struct cpu_tid {
	__u32 cpu;
	__u32 tid;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); // set to the possible CPUs before loading
	__type(key, __u32);
	__type(value, struct running);
} cur SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); // set before loading
	__type(key, struct cpu_tid);
	__type(value, __u64);
} acc SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(switch_times, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 cpu = bpf_get_smp_processor_id();
	struct running *r = bpf_map_lookup_elem(&cur, &cpu);
	if (!r)
		return 0;
	if (r->since) {
		// The slice is keyed by the task last switched in here, so a
		// missed switch gives the gap to one task, never two.
		struct cpu_tid k = { .cpu = cpu, .tid = r->tid };
		__u64 ns = now - r->since;
		__u64 *v = bpf_map_lookup_elem(&acc, &k);
		if (v)
			__sync_fetch_and_add(v, ns);
		else if (bpf_map_update_elem(&acc, &k, &ns, BPF_NOEXIST))
			__sync_fetch_and_add(&r->dropped, 1);
		if ((__u32)prev->pid != r->tid)
			__sync_fetch_and_add(&r->unchained, 1);
	}
	r->since = now;
	r->tid = next->pid;
	return 0;
}

// ---- who waited behind whom ----

struct seg {
	__u64 t;   // runqueue clock at the switch that ended the segment
	__u32 tid; // the task that ran until then
	__u32 pad;
	char comm[COMM_LEN];
};

struct cpu_log {
	__u64 head; // switches logged so far; the newest is seg[(head - 1) & MASK]
	struct seg seg[LOG_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); // set to the possible CPUs before loading
	__type(key, __u32);
	__type(value, struct cpu_log);
} logs SEC(".maps");

// A followed thread: the user space side puts every thread whose waits
// are wanted here and takes out the ones that are gone.
struct followed {
	__u64 seen_delay; // run_delay when last seen (valid when seen)
	__u64 seen;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); // set before loading
	__type(key, __u32);
	__type(value, struct followed);
} follow SEC(".maps");

struct wait_key {
	__u32 waiter;
	__u32 culprit; // a tid; 0 idle; UNKNOWN below
};

struct wait_val {
	__u64 ns;
	char comm[COMM_LEN]; // the culprit's, when last charged
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); // set before loading
	__type(key, struct wait_key);
	__type(value, struct wait_val);
} waits SEC(".maps");

// Per waiter since the last drain: waits ended (switched in) or moved
// (migrated), and distinct culprits charged.
struct waiter_count {
	__u64 waits;
	__u64 culprits;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); // set before loading
	__type(key, __u32);
	__type(value, struct waiter_count);
} counts SEC(".maps");

// The culprit of wait time the programs could not place (run_delay added
// where no program ran): user space's `Culprit::UNKNOWN`.
#define UNKNOWN_TID 0xfffffffe
// Culprits beyond MAX_CULPRITS for one waiter, and the older part of a
// wait beyond MAX_WALK segments: user space's `Culprit::OTHER`.
#define OTHER_TID 0xffffffff
// task_struct::on_rq of a task being moved between runqueues.
#define TASK_ON_RQ_MIGRATING 2

enum {
	ST_FULL,	 // charges lost: `waits` was full
	ST_FULL_NS,
	ST_CUT,		 // waits whose older part went to OTHER (MAX_WALK)
	ST_CUT_NS,
	ST_UNSEEN,	 // migrations of a followed thread not seen before
	ST_COUNTS_FULL,	 // waits not counted: `counts` was full
	ST_UNPLACED,	 // run_delay the kernel added where no program could
	ST_UNPLACED_NS,	 // split it (an event skipped, a move that was not a
			 // queued task's), charged to UNKNOWN
	ST_NO_RQ,	 // events skipped: the task's runqueue was out of reach
			 // or not its CPU's
	ST_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ST_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void stat_add(__u32 which, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &which);
	if (v)
		__sync_fetch_and_add(v, n);
}

static __always_inline struct waiter_count *counted(__u32 waiter)
{
	struct waiter_count *c = bpf_map_lookup_elem(&counts, &waiter);
	if (c)
		return c;
	struct waiter_count zero = {};
	if (bpf_map_update_elem(&counts, &waiter, &zero, BPF_NOEXIST)) {
		c = bpf_map_lookup_elem(&counts, &waiter);
		if (!c)
			stat_add(ST_COUNTS_FULL, 1);
		return c;
	}
	return bpf_map_lookup_elem(&counts, &waiter);
}

static __always_inline void charge(__u32 waiter, __u32 culprit,
				   const char *comm, __u64 ns)
{
	if (!ns)
		return;
	struct wait_key k = { .waiter = waiter, .culprit = culprit };
	struct wait_val *v = bpf_map_lookup_elem(&waits, &k);
	if (v) {
		__sync_fetch_and_add(&v->ns, ns);
		// The latest name: a culprit forked by a shell and then exec'd
		// was named by the shell's comm for the whole interval.
		if (comm)
			__builtin_memcpy(v->comm, comm, COMM_LEN);
		return;
	}
	// A new culprit of this waiter: within its bound, else OTHER.
	struct waiter_count *c = counted(waiter);
	if (c && culprit != OTHER_TID) {
		if (c->culprits >= MAX_CULPRITS) {
			k.culprit = OTHER_TID;
			comm = 0;
			v = bpf_map_lookup_elem(&waits, &k);
			if (v) {
				__sync_fetch_and_add(&v->ns, ns);
				return;
			}
		} else {
			__sync_fetch_and_add(&c->culprits, 1);
		}
	}
	struct wait_val nv = { .ns = ns };
	if (comm)
		__builtin_memcpy(nv.comm, comm, COMM_LEN);
	if (bpf_map_update_elem(&waits, &k, &nv, BPF_NOEXIST)) {
		// Another CPU put it there meanwhile, or the map is full.
		v = bpf_map_lookup_elem(&waits, &k);
		if (v) {
			__sync_fetch_and_add(&v->ns, ns);
			return;
		}
		stat_add(ST_FULL, 1);
		stat_add(ST_FULL_NS, ns);
	}
}

static __always_inline void count_wait(__u32 waiter)
{
	struct waiter_count *c = counted(waiter);
	if (c)
		__sync_fetch_and_add(&c->waits, 1);
}

// Charge the wait (from, to] of `waiter` on the CPU of `log`: first the
// task running since the newest switch (`cur`, from that switch up to
// `to`: only at a migration, since at a switch `to` is that switch), then
// the logged segments, newest first (at most MAX_WALK; the older rest to
// OTHER). seg[j] ran from switch j - 1 to switch j.
static __always_inline void split(struct cpu_log *log, struct task_struct *cur,
				  __u32 waiter, __u64 from, __u64 to)
{
	__u64 head = log->head;
	__u64 end = to;
	if (head && cur) {
		__u64 newest = log->seg[(head - 1) & LOG_MASK].t;
		if (newest < end) {
			__u64 start = newest > from ? newest : from;
			// `cur` came from a read, not a typed pointer: read its fields.
			char comm[COMM_LEN] = {};
			bpf_probe_read_kernel(comm, COMM_LEN, __builtin_preserve_access_index(&cur->comm));
			charge(waiter, BPF_CORE_READ(cur, pid), comm, end - start);
			end = start;
		}
	}
	for (int n = 0; n < MAX_WALK; n++) {
		// seg[j] and the switch before it, still in the log.
		if (end <= from || head < (__u64)n + 2 || n + 2 > LOG_LEN)
			break;
		__u64 j = head - 1 - n;
		struct seg *s = &log->seg[j & LOG_MASK];
		__u64 start = log->seg[(j - 1) & LOG_MASK].t;
		__u64 stop = s->t < end ? s->t : end;
		if (start < from)
			start = from;
		if (stop > start)
			charge(waiter, s->tid, s->comm, stop - start);
		if (start < end)
			end = start;
	}
	if (end > from) {
		charge(waiter, OTHER_TID, 0, end - from);
		stat_add(ST_CUT, 1);
		stat_add(ST_CUT_NS, end - from);
	}
}

SEC("tp_btf/sched_switch")
int BPF_PROG(switch_waits, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct cpu_log *log = bpf_map_lookup_elem(&logs, &cpu);
	if (!log)
		return 0;
	int rq_cpu;
	__u64 now = rq_clock_of(rq_of(prev), &rq_cpu);
	if (rq_cpu != (int)cpu) {
		stat_add(ST_NO_RQ, 1);
		return 0;
	}
	// Log the segment prev ran.
	__u64 h = log->head;
	struct seg *s = &log->seg[h & LOG_MASK];
	s->t = now;
	s->tid = prev->pid;
	bpf_probe_read_kernel(s->comm, COMM_LEN, prev->comm);
	log->head = h + 1;

	__u32 p = prev->pid;
	struct followed *f = bpf_map_lookup_elem(&follow, &p);
	if (f) {
		// run_delay grows only when a task is switched in (or dequeued
		// while queued, seen by migrate_waits): growth seen at its
		// switch-out is the wait of a switch-in this program was not run
		// for (the kernel skips a few here), charged as unplaced rather
		// than lost.
		__u64 d = prev->sched_info.run_delay;
		if (f->seen && d > f->seen_delay) {
			charge(p, UNKNOWN_TID, 0, d - f->seen_delay);
			stat_add(ST_UNPLACED, 1);
			stat_add(ST_UNPLACED_NS, d - f->seen_delay);
			count_wait(p);
		}
		f->seen_delay = d;
		f->seen = 1;
	}
	__u32 n = next->pid;
	f = bpf_map_lookup_elem(&follow, &n);
	if (!f)
		return 0;
	// What sched_info_arrive is about to add to run_delay.
	__u64 queued = next->sched_info.last_queued;
	__u64 delay = next->sched_info.run_delay;
	if (f->seen && delay > f->seen_delay) {
		charge(n, UNKNOWN_TID, 0, delay - f->seen_delay);
		stat_add(ST_UNPLACED, 1);
		stat_add(ST_UNPLACED_NS, delay - f->seen_delay);
	}
	if (queued) {
		if (queued < now) {
			split(log, 0, n, queued, now);
			delay += now - queued;
		}
		count_wait(n);
	}
	f->seen_delay = delay;
	f->seen = 1;
	return 0;
}

SEC("tp_btf/sched_migrate_task")
int BPF_PROG(migrate_waits, struct task_struct *p, int dest_cpu)
{
	__u32 tid = p->pid;
	struct followed *f = bpf_map_lookup_elem(&follow, &tid);
	if (!f)
		return 0;
	__u64 delay = p->sched_info.run_delay;
	if (!f->seen) {
		f->seen_delay = delay;
		f->seen = 1;
		stat_add(ST_UNSEEN, 1);
		return 0;
	}
	__u64 before = f->seen_delay;
	f->seen_delay = delay;
	if (delay <= before)
		return 0; // a sleeping task moved by its wake-up: no wait
	__u64 grew = delay - before;
	// A queued task the load balancer (or an affinity change) moves is
	// marked migrating, dequeued from its old runqueue (which adds the wait
	// so far to run_delay) and still on it here (task_cpu and the CFS
	// runqueue change after the tracepoint), with that runqueue locked:
	// its clock is the dequeue's. Any other growth (a move at a wake-up,
	// where run_delay grew where no program could see it) is not split.
	int rq_cpu = -1;
	__u32 orig = task_cpu_of(p);
	struct rq *rq = 0;
	if (BPF_CORE_READ(p, on_rq) == TASK_ON_RQ_MIGRATING)
		rq = rq_of(p);
	__u64 now = rq_clock_of(rq, &rq_cpu);
	struct cpu_log *log = bpf_map_lookup_elem(&logs, &orig);
	if (!log || rq_cpu != (int)orig || now <= grew) {
		if (rq && rq_cpu != (int)orig)
			stat_add(ST_NO_RQ, 1);
		charge(tid, UNKNOWN_TID, 0, grew);
		stat_add(ST_UNPLACED, 1);
		stat_add(ST_UNPLACED_NS, grew);
		count_wait(tid);
		return 0;
	}
	struct task_struct *cur = 0;
	bpf_probe_read_kernel(&cur, sizeof(cur), __builtin_preserve_access_index(&rq->curr));
	split(log, cur, tid, now - grew, now);
	count_wait(tid);
	return 0;
}
