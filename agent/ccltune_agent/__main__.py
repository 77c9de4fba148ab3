"""python -m ccltune_agent"""

from .cli import main

main()
