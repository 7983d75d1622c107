"""python -m providers.docker.nodeimage [--force]: build the node base image."""
import sys

from .base import main

sys.exit(main())
