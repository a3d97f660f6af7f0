"""Tests of the deployments: docker-compose, the Spark cluster, distributed settings, secrets."""
