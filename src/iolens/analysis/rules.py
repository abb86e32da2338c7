"""Every threshold the verdict uses, in one place, each with its reason.

Change a number here and the verdict, the live view, the reports and
their tests all follow. The figures are compared with the recorded ones
as they are (percent, milliseconds, bytes per second).
"""

from __future__ import annotations

# -- severity: the share of step time the training loop waits for data ----------------
# The bands of TensorFlow's input pipeline analyzer (DESIGN.md "The verdict").
MODERATE = 0.05
"""Below this the input pipeline keeps up: waiting 5% of the time costs at most 5%."""
HIGH = 0.20
"""From here, fixing the input pipeline gains at least 1.25x steps per second."""

# -- enough data for a verdict ---------------------------------------------------------
MIN_BATCHES = 20
"""Fewer timed batches than this say too little: the verdict waits (live) or says so."""

# -- storage ---------------------------------------------------------------------------
UTIL_SATURATED = 80.0
"""%util sustained over 80% means the device is busy nearly all the time (the
classic iostat reading). %util understates load on devices that serve
requests in parallel (NVMe, RAID), so await below is a second witness."""
AWAIT_SLOW_MS = 10.0
"""r_await over ~10 ms means reads queue or the medium is slow (a local SSD
answers in well under 1 ms, a spinning disk in 5-10 ms)."""
QUEUE_BUSY = 1.0
"""aqu-sz of 1 or more: requests wait behind each other; with a slow await it
confirms the device, not the job, sets the pace."""
JOB_SHARE_OWN = 0.5
"""The job makes up the device's load when at least half its bytes are the job's."""
SMALL_READ_KIB = 128.0
"""Average reads under 128 KiB on a busy device are the small-file pattern that
packing (LMDB, HDF5, tar shards, memmap) turns into large sequential reads;
larger ones are bandwidth-bound, where only faster storage or caching helps."""
BLOCKED_DEVICE_UTIL = 50.0
"""A fetch blocked off CPU while it reads a dataset whose device is half busy or more
waits on that device, though it is not saturated (a throughput cap above it holds a
JPEG folder read by two workers at 80% util, 6 ms a read, 8.0 MB/s flat)."""
D_STATE_SHARE = 0.5
"""Processes in uninterruptible sleep (state D) in half their samples or more (the
fetching ones where the records tell them, else the job's):
the job waits on I/O even when the device it reads is not busy, because the
limit sits above the device (a cgroup throttle, a network filesystem)."""

# -- CPU -------------------------------------------------------------------------------
WORKER_CPU_BUSY = 80.0
"""A DataLoader worker using 80% or more of a core is CPU-bound on decode and
augmentation: more workers or cheaper transforms help, faster disks do not."""
MACHINE_IDLE_LOW = 10.0
"""Under 10% idle (iowait counted as idle: it is free CPU) the machine has no
core left for more workers."""
FETCH_QUEUED = 0.25
"""Workers that wait for a core a quarter of their fetch or more, more of them than the job
has cores, are told to be fewer."""
HANDOVER_FIXED = 2.0
"""A batch of tensors costs the loop, to take from a worker, a part of its own and a part
for each tensor: the batch's own part is that of about 2 tensors (0.31 ms against 0.15 ms
in the lab; NOTE [a tensor's hand-over] in iolens/analysis/verdict/workers.py)."""
HANDOVER_TENSOR_S = 0.00015
"""... and each tensor's part, 0.15 ms in the lab: a batch of k tensors is handed over in
(HANDOVER_FIXED + k) times this (a faster machine takes less, and gains more) ..."""
HANDOVER_FREE_MIB = 2.0
"""... and nothing for the bytes of a batch up to 2 MiB (0.44-0.46 ms a batch in the lab
from 16 KiB to 2 MiB) ..."""
HANDOVER_MIB_S = 0.0003
"""... and 0.3 ms for each MiB beyond: 1.02-1.16 ms at 4 MiB in the lab, 1.92 ms at 8 MiB
(where the workers writing the bytes took the loop's cores, and the model's 2.25 ms is
the lesser gain)."""
HANDOVER_RELEASE_MIB_S = 0.0001
"""A batch of tensors, once the loop lets it go, frees the shared memory its worker wrote
it into: 0.1 ms of the loop's CPU for each MiB at the lab's pace (NOTE [a tensor's
release] in iolens/analysis/verdict/workers.py)."""
HANDOVER_WRITE_MIB_S = 0.0011
"""A batch returned as tensors costs its worker, beyond the fetch, the collate that writes
it into shared memory and its sending: 1.1 ms of CPU for each MiB at the lab's pace
(NOTE [a tensor's write] in iolens/analysis/model/changes.py)."""
PACE_LAB_S = 0.00037
"""The lab's pace for Python's own work (NOTE [the machine's pace] in
iolens/recorder/pace.py): the recorder's fixed piece of work in 0.36-0.38 ms, the
quickest this machine ran it, on the days the hand-over's figures above held. A run whose
pace is slower has them scaled up by its pace over this one."""
PACE_BOUNDS = (0.5, 3.0)
"""The most a run's pace moves the lab's figures either way: a pace beyond is a machine
too unlike the lab's for a scaled figure to stand for it."""
WORKER_CPU_SOME = 50.0
"""On a machine with no idle core, workers using half a core or more are held
back by the CPU they share; workers using less mostly wait on something else,
and a busy machine is not what starves them."""

# -- writes ----------------------------------------------------------------------------
STALL_SHARE = 0.05
"""Steps that take longer while the job's writes saturate a device, by more than
5% of the step time in all, make a write stall (checkpoints, logs)."""
WRITE_LOOKBACK_S = 30.0
"""The job's write() calls dirty the page cache; the device writes the data at
fsync() or when writeback comes for it, which the kernel starts for data older
than 30 s (vm.dirty_expire_centisecs). The job's writes are looked for that far
before an episode of write saturation."""

# -- secondary findings ----------------------------------------------------------------
NEIGHBOR_UTIL = 50.0
"""A device at least half busy while the job makes up less than half its load
has another process competing with the job (noisy neighbour)."""
NEIGHBOR_SHARE_OF_TIME = 0.2
"""... in at least a fifth of the training time, so one burst is not a finding."""
WARM_CACHE_HIT = 0.9
"""9 reads in 10 served from the page cache: the run measured a warm cache."""
WARM_CACHE_MIN_RCHAR = 1 << 20
"""... of at least 1 MiB/s read through syscalls, so an idle job is not 'warm'."""
COLD_START_SHARE_OF_TIME = 0.2
"""The first fifth of the training time is the start-up window."""
COLD_START_RATIO = 2.0
"""A start-up window that waits twice as much as the rest (and is itself in the
high band) is a cold start: the cache fills, workers spin up."""
EPOCH_START_RATIO = 5.0
"""An epoch's first batch that waits five times the median wait: the workers
are started anew each epoch (no persistent_workers) or prefetch is empty."""
EPOCH_START_SHARE = 0.02
"""... and those first batches add up to 2% of the step time or more."""
EPOCH_START_LEAD = 0.25
"""Workers started anew each epoch whose starts (the run's first left out) are a quarter
of the data wait or more, or 5% of the step time (MODERATE) where the start sits in the
step (iter() waiting for its workers): keeping them is the verdict's first advice."""

# -- ranks -----------------------------------------------------------------------------
STRAGGLER_GAP = 0.10
"""In synchronous data-parallel training every rank waits for the slowest at each
all-reduce, so one rank's input pipeline sets the pace. A rank whose data-wait
share is 10 points above the other ranks' median ..."""
STRAGGLER_RATIO = 2.0
"""... and twice it, is the straggler (the others' own wait is their noise floor)."""
STRAGGLER_MIN_BATCHES = 20

HANG_LOOKBACK = 60
"""A hang's processes are described from up to this many of its last intervals, each
as most of them saw it."""
"""Ranks with fewer timed batches than this are not compared."""

# -- the input pipeline from inside (the workers' own stage timing) ---------------------
FETCH_BLOCKED = 0.5
"""A fetch that spends more than half its wall time off the CPU is waiting on something
(the storage, the network, a lock, a sleep): more CPU does not speed it up."""
CLOSE_CALL = 0.1
"""Workers idle within 10 points of WORKERS_IDLE (40-60% of their time), or a fetch off the
CPU within 10 points of FETCH_BLOCKED (40-60% of the workers' busy time), where that half
decided the class, is a close call, and the verdict's caveat says so (NOTE [a close call]
in iolens/analysis/verdict/inputbound.py)."""
FETCH_CPU = 0.5
"""A fetch that spends half its time or more on the CPU is decode and augmentation:
cheaper transforms or more cores help, faster storage does not."""
WORKERS_IDLE = 0.5
"""Workers idle half their time or more wait for the loop to ask: they keep up, and more
of them cannot shorten the wait that is left (hand-over, epoch starts).

NOTE [idle workers queued for a core]: not where their fetch waits for a core
(FETCH_QUEUED). Six JPEG workers on 2 cores, the loop waiting 25-32% of its step, idled
38-52% of their time in ten runs while their fetch waited for a core 55-62% of it: the
batch the loop waits for is queued, those done idle behind it (batches come back in
order), and the loop's own hand-over (4.2-5.8 ms a batch) waits for a core too. One run
in ten crossed half and was called handover-bound, whose advice (a cheaper hand-over)
leaves the queue; fewer workers shorten it. Workers idle behind a slow hand-over on free
cores (4 MiB a batch, 2 workers) waited for a core under 1% of their fetch."""
READS_DATA_BYTES = 1024.0
"""A fetch that reads under 1 KiB per sample through syscalls, in no file, reads no
dataset: what it blocks on is not storage."""
READS_DATA_BYTES_IN_PROCESS = 8192.0
"""... 8 KiB where the training process fetches (num_workers=0): its rchar is the whole
process's, and the modules it imports lazily in its first seconds came to 0.5-2.6 KiB a
sample in a 7-second lab run that read no file. Its bytes from the disk too: its
libraries' pages, read in as they are first used, came to 1.5 KiB a sample in another.
Most of them fall before the first batch: NOTE [the loop's own reads] in
iolens/analysis/pipeline.py leaves that interval out where there are enough others."""
HANDOVER_SHARE = 0.5
"""With the workers idle, the wait is the hand-over's when the batches' hand-over and the
epochs' first batches make half of it or more; else the workers idle behind one slow
batch (batches come back in order)."""

# -- predictions (iolens.analysis.model) -------------------------------------------------
MIN_GAIN = 1.05
"""A change the model predicts to gain under 5% is not offered as a fix: that is within a
shared machine's run-to-run noise, and the change has its costs (memory, a repack)."""
PACK_REQUEST_BYTES = 1 << 20
"""A pack read in blocks of a batch (iolens.data.BlockShuffleSampler) is read in requests
of the device's readahead window (the storage probe's sequential read size), or of the
batch where that is larger, counted here at most 1 MiB (a larger read may be split
below)."""

NET_SCALING_INTERVALS = 3
"""A level of connections open is compared only when seen in this many intervals or more."""
NET_CAPPED_GAIN = 0.25
"""A network store that gives under a quarter of the bytes more connections would bring
(twice the connections, under 25% more bytes a second) caps its throughput."""
NET_LATENCY_GAIN = 0.6
"""... and one that gives 60% of it or more answers slowly: more requests in flight help."""
PACKED_FILE_BYTES = 1 << 20
"""A data file of 1 MiB or more and PACKED_FILE_SAMPLES samples or more holds a dataset
packed already (LMDB, HDF5, Arrow, tar shards of any size): it is not packed again."""
PACKED_FILE_SAMPLES = 32
PACKED_FILES_PER_SAMPLE = 0.1
"""... unless the fetch also opens a file for every few samples (a file per sample)."""
