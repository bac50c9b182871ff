"""``python -m packer`` runs the command-line interface."""

from packer.cli.app import main

if __name__ == "__main__":
    main()
