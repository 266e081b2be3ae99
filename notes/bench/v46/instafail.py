import os

def pytest_runtest_logreport(report):
    if report.failed:
        with open(os.path.join(os.environ.get("OUT", "/tmp"), "failures.txt"), "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longrepr}\n")
    if report.when == "call" or report.failed:
        with open(os.path.join(os.environ.get("OUT", "/tmp"), "done.txt"), "a") as f:
            f.write(f"{report.outcome} {report.nodeid} {report.duration:.1f}\n")
