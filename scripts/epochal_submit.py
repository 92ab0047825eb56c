"""Entry point for ``spark-submit``: ``spark-submit --master spark://host:7077 scripts/epochal_submit.py run
--job J``. The launcher's master (and every ``--conf``) wins over ``PIPELINE_SPARK_MASTER``; see
docs/deployment.md. (A file outside the package, so that the script's directory on ``sys.path`` shadows no
standard-library module.)"""
import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
