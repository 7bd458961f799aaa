from jobtui import Client


def test_enqueue_claim_complete(dsn: str) -> None:
    with Client(dsn) as q:
        job_id = q.enqueue("t", {"a": 1})
        [job] = q.claim(["t"], worker="w1", limit=5)
        assert job.id == job_id and job.attempt == 1
        assert q.complete([job.lease]) == {job_id}
        row = q.get(job_id)
        assert row is not None and row.status == "done"
