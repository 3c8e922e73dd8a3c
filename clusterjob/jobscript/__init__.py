"""From a researcher's request to a job script: resolve against the site, render, quote."""
