//! The machine's own stalls: a thread pinned to each CPU does nothing but
//! read the clock, and every gap between two readings is time the CPU was
//! taken from it (a hypervisor's steal, an interrupt, another task). Then
//! two threads on two CPUs pass a byte back and forth after a pause, as a
//! lone update's steps wake one another on idle CPUs. A round trip that
//! meets a stall or a slow wake-up is slow whatever the code does, so the
//! suite prints both before each scenario and after the last, beside the
//! p99s they bound.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

use crate::report::{Table, millis, quantile};

/// Gaps on one CPU while its thread spun.
struct Gaps {
    cpu: usize,
    over: [u32; 3],
    longest: Duration,
    lost: Duration,
}

/// The gaps that count: longer than 1, 2 and 5 ms.
const BOUNDS: [Duration; 3] = [
    Duration::from_millis(1),
    Duration::from_millis(2),
    Duration::from_millis(5),
];

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> nix::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)
}

/// Spins on `cpu` for `length`, noting every gap over 1 ms.
fn spin(cpu: usize, length: Duration) -> nix::Result<Gaps> {
    pin(cpu)?;
    let mut gaps = Gaps {
        cpu,
        over: [0; 3],
        longest: Duration::ZERO,
        lost: Duration::ZERO,
    };
    let started = Instant::now();
    let mut last = started;
    while last - started < length {
        let now = Instant::now();
        let gap = now - last;
        last = now;
        if gap > BOUNDS[0] {
            for (count, bound) in gaps.over.iter_mut().zip(BOUNDS) {
                *count += u32::from(gap > bound);
            }
            gaps.longest = gaps.longest.max(gap);
            gaps.lost += gap;
        }
    }
    Ok(gaps)
}

/// Spins a thread on every CPU this process may use, all at once, and
/// prints what each lost; `when` says at which point of the run.
pub fn print(when: &str, length: Duration) {
    if length.is_zero() {
        return;
    }
    let cpus = match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect::<Vec<_>>(),
        Err(e) => {
            println!("\nstalls: not measured: reading this process's CPUs: {e}");
            return;
        }
    };
    let spun: Vec<nix::Result<Gaps>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (cpus.iter())
            .map(|&cpu| scope.spawn(move || spin(cpu, length)))
            .collect();
        (threads.into_iter())
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut table = Table::new(
        format!(
            "stalls, {when}: a thread spinning on each CPU for {} s with nothing else running \
             (gaps between two clock readings)",
            length.as_secs_f64()
        ),
        &[
            "cpu",
            "> 1 ms",
            "> 2 ms",
            "> 5 ms",
            "longest (ms)",
            "lost (ms)",
        ],
    );
    for gaps in spun {
        match gaps {
            Ok(g) => table.row(vec![
                g.cpu.to_string(),
                g.over[0].to_string(),
                g.over[1].to_string(),
                g.over[2].to_string(),
                millis(g.longest),
                millis(g.lost),
            ]),
            Err(e) => println!("\nstalls: a CPU not measured: pinning its thread: {e}"),
        }
    }
    table.print();
    println!(
        "  lost: the sum of the gaps over 1 ms; a round trip that meets one is that much slower."
    );
    let (from, to) = (cpus[0], cpus[cpus.len() - 1]);
    let trips = (length.as_millis() / 2).max(1) as usize;
    match wake_ups(from, to, trips) {
        Ok(mut times) => {
            times.sort();
            let over = |ms: u64| {
                let bound = Duration::from_millis(ms);
                times.iter().filter(|t| **t > bound).count()
            };
            println!(
                "  wake-ups: {trips} round trips between CPU {from} and CPU {to} through a unix \
                 socket pair, each after {} ms idle: median {} ms, p99 {} ms, longest {} ms; \
                 over 1 ms: {}, over 2 ms: {}",
                PAUSE.as_millis(),
                millis(quantile(&times, 0.5)),
                millis(quantile(&times, 0.99)),
                millis(times[times.len() - 1]),
                over(1),
                over(2),
            );
        }
        Err(e) => println!("  wake-ups: not measured: {e}"),
    }
}

/// How long the CPUs idle before each wake-up round trip: long enough for
/// the other CPU to go idle, as it does between two steps of an update
/// (a thread of the daemon waiting for the next).
const PAUSE: Duration = Duration::from_millis(1);

/// `trips` round trips of one byte between a thread on `from` and one on
/// `to`, each after `PAUSE`.
fn wake_ups(from: usize, to: usize, trips: usize) -> anyhow::Result<Vec<Duration>> {
    let (mut near, mut far) = UnixStream::pair()?;
    std::thread::scope(|scope| {
        let echo = scope.spawn(move || -> anyhow::Result<()> {
            pin(to)?;
            let mut byte = [0u8];
            while far.read(&mut byte)? == 1 {
                far.write_all(&byte)?;
            }
            Ok(())
        });
        // On a thread of its own too: pinning the caller would pin the
        // scenarios that follow.
        let timed = scope
            .spawn(move || -> anyhow::Result<Vec<Duration>> {
                pin(from)?;
                let mut times = Vec::with_capacity(trips);
                let mut byte = [0u8];
                for _ in 0..trips {
                    std::thread::sleep(PAUSE);
                    let sent = Instant::now();
                    near.write_all(&byte)?;
                    near.read_exact(&mut byte)?;
                    times.push(sent.elapsed());
                }
                near.shutdown(std::net::Shutdown::Both)?;
                Ok(times)
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        echo.join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        timed
    })
}
