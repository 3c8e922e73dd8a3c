"""clusterjob from Python: a command job, a function job and a map, on this cluster (or on
one reached over ssh: Cluster(host="hpc"))."""

import clusterjob


def train(lr: float) -> float:
    """Stands in for a training run: returns its 'loss'."""
    return round(1.0 / (1.0 + 100 * lr), 4)


cluster = clusterjob.Cluster()

job = cluster.submit(["python", "-c", "print('hello from the cluster')"], time="0:05:00")
print(job.id, job.wait().state)
print(job.logs().strip())

one = cluster.options(time="0:05:00").submit_function(train, 3e-4)
print("loss", one.result())

sweep = cluster.options(time="0:05:00").map(train, [1e-4, 3e-4, 1e-3])  # ONE array job
print("losses", [j.result() for j in sweep])
