import PolicyCLI
