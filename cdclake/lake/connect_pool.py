"""The one process-wide fix a Spark Connect client needs here (:func:`keep_release_pool`)."""

from __future__ import annotations


def keep_release_pool() -> None:
    """pyspark's ``SparkConnectClient.close()`` (also run by a session's ``__del__``, in whatever
    thread the collector runs) shuts down the release pool ALL sessions of the process share,
    joining its threads under a class lock: run inside one of them it joins itself and every
    later query of every session waits forever (py-spy showed it). The pool lives on instead."""
    from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as Iterator

    Iterator.shutdown = classmethod(lambda cls: None)  # type: ignore[method-assign,assignment]
