"""A submitit driver ported to clusterjob, line for line (submitit's call in each comment):
a command, a function, a map over 20 inputs of which one raises, the options given to
every submission, and a job found again by its id. The test suite runs it on the local
cluster."""

import clusterjob


def add(a: int, b: int) -> int:
    return a + b


def risky(x: int) -> int:
    if x == 13:
        raise ValueError(f"unlucky {x}")
    return x * x


cluster = clusterjob.Cluster()  # executor = submitit.AutoExecutor(folder="logs")
five_minutes = cluster.options(time="0:05:00")  # executor.update_parameters(timeout_min=5)

# executor.submit(submitit.helpers.CommandFunction(["echo", "hello"]))
command = five_minutes.options(job_name="hello").submit(["echo", "hello"])
function = five_minutes.options(job_name="add").submit_function(add, 5, 7)  # .submit(add, 5, 7)
jobs = five_minutes.options(job_name="risky").map(risky, range(20))  # .map_array(risky, ...)

# a command's result() is its final status (submitit's is its stdout): the output is stdout()
print("command", command.result().exit_code, command.stdout().strip())
print("function", function.id, function.result())
for x, job in enumerate(jobs):
    try:
        print("map", x, job.result())
    except ValueError as exc:  # re-raised here, as submitit does; the traceback is in stderr
        print("map", x, "raised", exc, "|", job.stderr().strip().splitlines()[-1])

again = clusterjob.Cluster().job(function.id)  # submitit.SlurmJob(folder="logs", job_id=...)
print("again", again.id, again.result())
