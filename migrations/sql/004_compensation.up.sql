-- millrace 004_compensation: reserved; its tables come with the package.
SELECT 1;
