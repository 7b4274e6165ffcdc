//! What a decision allocates, counted by a global allocator that counts the
//! allocations of each thread. One test in this binary: the metrics
//! recorder and the allocator are process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use metrics_exporter_prometheus::PrometheusBuilder;
use ratelimit::{Limiter, Quota, Request};

struct Counting;

thread_local! {
    // A constant start and no destructor: reading it never allocates.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is handed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// 1,000 admissions of known keys, after each key and the rule's metric
/// were made, and the runtime's task yielded (its budget spent), once: what
/// they allocated.
fn allocated_by_admissions(limiter: &Limiter, runtime: &tokio::runtime::Runtime) -> u64 {
    let quota = Quota::new(1_000_000, "1000/s".parse().unwrap()).unwrap();
    let keys: Vec<String> = (0..100).map(|i| format!("user:{i}")).collect();
    runtime.block_on(async {
        let check = |key| limiter.check(Request::new(&quota, key).rule("checkout"));
        for _ in 0..3 {
            for key in &keys {
                check(key).await.expect("admitted");
            }
        }
        let before = allocations();
        for _ in 0..10 {
            for key in &keys {
                check(key).await.expect("admitted");
            }
        }
        allocations() - before
    })
}

/// An admission of a known key on the memory backend allocates nothing.
/// With a Prometheus recorder installed, as a service exporting the
/// limiter's metrics has it, it allocates once: the handle the recorder
/// makes at each registration. The metric's key is made once, of static
/// parts, so the recorder's copy of it at each registration copies
/// pointers; a key made of labels known only at run time (what `counter!`
/// makes of them) was copied into an allocation of its own at every count.
#[test]
fn an_admission_of_a_known_key_allocates_nothing_but_the_recorders_handle() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let limiter = Limiter::memory();
    let allocated = allocated_by_admissions(&limiter, &runtime);
    assert_eq!(
        allocated, 0,
        "with no recorder, 1,000 admissions of known keys allocated {allocated} times"
    );

    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this binary");
    let allocated = allocated_by_admissions(&limiter, &runtime);
    assert!(
        allocated <= 1_000,
        "with a Prometheus recorder, 1,000 admissions of known keys allocated {allocated} times, \
         more than the recorder's handle of each"
    );
    let exposition = prometheus.render();
    assert!(
        exposition.contains(r#"ratelimit_decisions_total{rule="checkout",outcome="allowed"} 1300"#),
        "every admission since the recorder was installed counted:\n{exposition}"
    );
}
