"""The named injection points that racecheck.fsdp marks with `Runtime.point(name, ...)`."""

POINTS = {
    "before_all_gather": "host, inside the all-gather stream context, before the all-gather is enqueued",
    "after_all_gather": "host, inside the all-gather stream context, after the all-gather is enqueued",
    "wait_all_gather": "host, after the default stream was made to wait for the all-gather",
    "before_reduce_scatter": "host, inside the reduce-scatter stream context, before the collective",
    "after_reduce_scatter": "host, inside the reduce-scatter stream context, after the collective",
    "before_all_reduce": "host, inside the all-reduce stream context, before the HSDP all-reduce",
    "after_all_reduce": "host, inside the all-reduce stream context, after the HSDP all-reduce",
    "reshard": "host, when a group drops its unsharded parameters",
    "end_of_backward": "host, after the default stream waited for the reduction streams",
}
