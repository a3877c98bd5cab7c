-- millrace 005_saga: reserved; its tables come with the package.
SELECT 1;
